"""What clients saw while a change ran, as the reports carry it: the downtime probe's figures (one model),
the load through the gateway's edge and where a rolling change stopped (services)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Downtime(_Frozen):
    """How long the endpoint did not answer while a change ran (polled from the control node)."""

    seconds: float  # all outages together
    longest: float
    outages: int
    answered_before: bool  # False: the service was not up when the run began (a first deploy)
    answers_after: bool
    probes: int
    interval: float  # the figures are as fine as this


class Availability(_Frozen):
    """What a small steady load through the gateway's edge saw while a change ran (services; from the control
    node: gpufleet.runner.availability)."""

    streams: int  # 0: not loaded (a service did not answer when the run began)
    models: tuple[str, ...]
    answered_before: bool
    requests: int
    failed: int
    # (seconds after the change began, HTTP status; 0 = no answer)
    failures: tuple[tuple[float, int], ...] = ()
    longest_gap: float = 0.0  # seconds without an answer, during the change
    p50_before_ms: float | None = None
    p99_before_ms: float | None = None
    p50_during_ms: float | None = None
    p99_during_ms: float | None = None


class RollingStop(_Frozen):
    """Where a rolling change of services stopped (playbooks/serve.yml's rescue: gpufleet_rolling)."""

    replica: str
    service: str
    node: str
    restored: bool  # the replica runs its revision from before the change again, back in its router
    why: str = ""
    restore: str = ""  # why it could not be restored
