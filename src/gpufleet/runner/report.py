"""What a deploy, status or teardown run reports: frozen models, serialisable as one JSON object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpufleet.runner.measured import Availability, Downtime, RollingStop
from gpufleet.vllm_log import PlanFigures, VllmFacts, compare

StageStatus = Literal["ok", "failed", "canceled", "timeout"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HostResult(_Frozen):
    """One host in one stage: Ansible's recap counts, and the time from its first to its last task."""

    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    seconds: float = 0.0


class Failure(_Frozen):
    """A task that failed on a host (or a host that could not be reached).

    ``message`` is the ``msg`` and ``stderr`` of the failed result as ansible-runner reported it; for a
    ``no_log`` task ansible-runner has already replaced the whole result with its "output has been hidden"
    notice, so no value of such a task can reach the report.
    """

    stage: str
    host: str
    task: str
    message: str
    unreachable: bool = False


class StageResult(_Frozen):
    name: str
    status: StageStatus
    seconds: float
    hosts: tuple[HostResult, ...] = ()
    failures: tuple[Failure, ...] = ()
    error: str | None = None  # what ansible-playbook said when it failed before any task (syntax, inventory)
    # No host ran it: every node was still as the last whole deploy left it (playbooks/fleet_check.yml)
    in_sync: bool = False
    # The stage that opened a whole deploy with the fleet check: each node the check found not as the last
    # whole deploy left it, and what differs there (the first difference met), so a slow re-run says why
    not_in_sync: dict[str, str] = {}
    # The known crash of the connection layer that failed this stage's first run; this is its second
    # (gpufleet.runner.transport)
    retried: str | None = None


class VerifyResult(_Frozen):
    """What the verify stage found (playbooks/verify.yml publishes it as ``gpufleet_verify``)."""

    completion: str  # the answer to the verify prompt, at temperature 0
    completion_tokens: int | None = None
    unauthorized_status: int | None = None  # what the same request without the API key got (401)
    metrics: bool = False  # /metrics answered with vLLM's metrics
    benchmark: dict[str, float] | None = None  # benchmarks/serving_throughput.py's figures, when asked for


class MonitoringEndpoints(_Frozen):
    """Where the monitoring stage's Prometheus and Grafana answer (on the head's cluster address)."""

    prometheus: str
    grafana: str | None = None
    targets_up: int = 0


class KeptRevision(_Frozen):
    """A revision a node keeps for rollback (the head's), as the playbook published it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    fleet: str | None = None  # the fleet revision: one change, the same on every node (and every replica)
    created: str | None = None
    image_name: str | None = None
    image_id: str | None = None
    model: dict[str, str] | None = None


class RollbackReport(_Frozen):
    """What a rollback did: the revision it restored, per node what it put back, and whether it serves."""

    slot: Literal["current", "previous"]
    ok: bool
    skipped: str | None = None  # why nothing was restored (no revision kept yet)
    revision: KeptRevision | None = None
    restarted: bool = False
    restored: dict[str, tuple[str, ...]] = {}
    stage: StageResult | None = None


class DeployReport(_Frozen):
    """The outcome of running stages (deploy, teardown): every stage run, in order, and what they set up."""

    ok: bool
    check_mode: bool = False
    seconds: float = 0.0
    stages: tuple[StageResult, ...] = ()
    failed_stage: str | None = None
    endpoint: str | None = None
    served_model: str | None = None
    vllm: VllmFacts | None = None
    verify: VerifyResult | None = None
    warnings: tuple[str, ...] = ()
    monitoring: MonitoringEndpoints | None = None
    downtime: Downtime | None = None
    rollback: RollbackReport | None = None
    replicas: tuple[ReplicaReport, ...] = ()  # services: each replica as the serve stage left it
    availability: Availability | None = None  # services: the load through the edge during the change
    rolling: RollingStop | None = None  # services: where a rolling change stopped

    @property
    def changed(self) -> int:
        """Changed tasks over every stage and host (0: the run found everything as it should be)."""
        return sum(host.changed for stage in self.stages for host in stage.hosts)

    @property
    def failures(self) -> tuple[Failure, ...]:
        return tuple(failure for stage in self.stages for failure in stage.failures)

    @property
    def not_in_sync(self) -> dict[str, str]:
        """The nodes that made a whole deploy run every stage, and what differed on each (the fleet check)."""
        return {host: why for stage in self.stages for host, why in stage.not_in_sync.items()}

    def compared_with(self, plan: PlanFigures) -> DeployReport:
        """This report with a warning for each vLLM fact more than 10% off the plan's prediction."""
        if self.vllm is None:
            return self
        return self.model_copy(update={"warnings": (*self.warnings, *compare(self.vllm, plan))})

    def replicas_compared_with(self, plans: Mapping[str, PlanFigures]) -> DeployReport:
        """This report with a warning, named by the replica, for each vLLM fact of a replica more than 10% off
        its own plan (``plans``: by replica id; a replica without a plan or facts is not compared)."""
        warnings = [
            f"replica {replica.id}: {warning}"
            for replica in self.replicas
            if replica.vllm is not None and replica.id in plans
            for warning in compare(replica.vllm, plans[replica.id])
        ]
        return self.model_copy(update={"warnings": (*self.warnings, *warnings)}) if warnings else self


class _Published(BaseModel):
    """Read from what a playbook published: keys it adds later are ignored, not refused."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class MissingNode(_Published):
    """An inventory node Ray does not report alive, and Ray's (or the probe's) reason."""

    host: str
    why: str = "not reported by Ray"


class OrphanProcess(_Published):
    """A vLLM process in the container that is not under the running service (left by a crash)."""

    pid: int  # on the node
    container_pid: int | None = None
    cmd: str = ""
    rss_mib: int = 0


class GpuHolder(_Published):
    """A process holding GPU memory that is not the service (nvidia-smi --query-compute-apps)."""

    pid: int
    mib: int | None = None
    cmd: str = ""
    in_container: bool = False


class NodeState(_Published):
    """One serving node as the status playbook found it."""

    host: str
    # Docker's state of the Ray container (running, exited, ...), "missing" or "unreachable"; "none" on a
    # node of a services inventory (each replica in a container of its own, no Ray: playbooks/cluster.yml)
    container: str = "unknown"
    container_unit: str = "unknown"
    vllm_unit: str = "unknown"  # "not here" where vLLM does not run (the Ray executor's workers)
    orphans: tuple[OrphanProcess, ...] = ()
    gpu_checked: bool = False
    gpu_note: str = ""  # why GPU memory was not checked
    gpu_outside: tuple[GpuHolder, ...] = ()
    procs_error: str | None = None  # the control script could not list the processes
    # What the node runs: the Ray container's image ID, the model's commit (its marker), vLLM's config file
    image_id: str | None = None
    model_revision: str | None = None
    config_sha256: str | None = None  # the head only (where vLLM's config is rendered)

    @property
    def problems(self) -> list[str]:
        said = []
        if self.container == "unreachable":
            said.append(f"{self.host}: unreachable")
            return said
        if self.container not in ("running", "none"):
            said.append(
                f"{self.host}: the Ray container is {self.container}"
                f" (its unit {self.container_unit}, vLLM's unit {self.vllm_unit})"
            )
        if self.orphans:
            listed = ", ".join(f"pid {o.pid} {o.cmd[:60]!r} ({o.rss_mib} MiB)" for o in self.orphans)
            said.append(f"{self.host}: {len(self.orphans)} vLLM process(es) outside the service: {listed}")
        if self.gpu_outside:
            listed = ", ".join(f"pid {g.pid} {g.cmd[:60]!r} {g.mib} MiB" for g in self.gpu_outside)
            said.append(f"{self.host}: GPU memory held by processes outside the service: {listed}")
        if self.procs_error:
            said.append(f"{self.host}: vLLM's processes could not be listed: {self.procs_error}")
        return said


class ReplicaReport(_Published):
    """One replica of a service as the serve stage left it (``gpufleet_replicas``, playbooks/serve.yml): its
    instance id, node, URL on the cluster network, GPUs and what its vLLM reported at start-up."""

    id: str
    service: str
    node: str
    url: str
    gpus: tuple[int, ...] = ()
    vllm: VllmFacts | None = None


class ReplicaState(_Published):
    """One replica of a service as the status playbook found it: its node's unit for it (systemd's state,
    or "unreachable") and whether it lists its model on ``/v1/models`` (asked by the gateway host, with the
    key)."""

    id: str
    service: str
    node: str
    url: str
    gpus: tuple[int, ...] = ()
    unit: str = "unknown"
    ready: bool = False
    role: Literal["prefill", "decode"] | None = None  # a P/D service's replica: its role

    @property
    def problems(self) -> list[str]:
        if self.ready:
            return []
        return [f"replica {self.id} on {self.node}: not ready (its unit {self.unit}, {self.url})"]


class RouterState(_Published):
    """One service's router on the gateway host (the gateway role's facts): whether systemd runs it, its
    workers, and the ones the router itself finds healthy (``answered``: its metrics could be read)."""

    service: str
    port: int | None = None
    active: str = "unknown"
    workers: tuple[str, ...] = ()
    healthy: tuple[str, ...] = ()
    answered: bool = False

    @property
    def problems(self) -> list[str]:
        """The router down, or workers it has taken out (empty when it routes to every worker)."""
        if self.active != "active":
            return [f"gateway {self.service}: its router is not running (systemd: {self.active})"]
        if not self.answered:
            return [f"gateway {self.service}: its router's metrics did not answer"]
        out = [worker for worker in self.workers if worker not in self.healthy]
        if not out:
            return []
        state = "down" if len(out) == len(self.workers) else "degraded"
        return [f"gateway {self.service}: {state}, the router finds unhealthy: {', '.join(out)}"]


class EdgeState(_Published):
    """The gateway's edge as a client finds it (asked from the gateway host by the status playbook, with the
    key): the HTTP status of ``GET /v1/models`` (0: no answer) and the models it lists."""

    url: str
    status: int = 0
    models: tuple[str, ...] = ()

    @property
    def problems(self) -> list[str]:
        if self.status == 200:
            return []
        answered = f"answered HTTP {self.status}" if self.status > 0 else "did not answer"
        return [f"gateway edge {self.url}: {answered} to GET /v1/models with the key"]


class ServiceLoad(_Frozen):
    """What vLLM is doing now (gpufleet.runner.service_load): from Prometheus over ``window``, or from two
    reads of /metrics ``window`` apart. None = not reported (no such metric, no request in the window)."""

    source: Literal["prometheus", "metrics"]
    window: str
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None  # a fraction of the KV cache's blocks in use
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    ttft_window: str | None = None  # the TTFT percentiles' window ("since vLLM started" when nothing recent)


class StatusReport(_Frozen):
    """The running service as the status playbook found it.

    The fields after ``stage`` are optional (a report without them, as older gpufleet wrote, still reads):
    the inventory nodes Ray does not report, each serving node's container and vLLM processes, and whether
    vLLM's start-up figures are stale (vLLM is not serving now, so they are the last run's).
    """

    ok: bool
    ray_nodes_alive: int | None = None
    ray_nodes_expected: int | None = None
    ray_gpus: float | None = None
    vllm_ready: bool = False
    endpoint: str | None = None
    served_model: str | None = None
    vllm: VllmFacts | None = None
    stage: StageResult
    ray_nodes_missing: tuple[MissingNode, ...] = ()
    nodes: tuple[NodeState, ...] = ()
    vllm_facts_stale: bool = False
    load: ServiceLoad | None = None
    gateway: tuple[RouterState, ...] = ()
    replicas: tuple[ReplicaState, ...] = ()  # services: every replica the planner placed
    edge: EdgeState | None = None  # services: the one endpoint, as a client finds it

    @property
    def services(self) -> dict[str, Literal["up", "degraded", "down"]]:
        """Each service by its replicas: up (all ready), degraded (some), down (none); {} for one model. A P/D
        service is down when every replica of one role is (a request needs a prefill and a decode)."""
        ready: dict[str, dict[str | None, list[bool]]] = {}
        for replica in self.replicas:
            ready.setdefault(replica.service, {}).setdefault(replica.role, []).append(replica.ready)
        states: dict[str, Literal["up", "degraded", "down"]] = {}
        for name, roles in ready.items():
            seen = [flag for flags in roles.values() for flag in flags]
            states[name] = (
                "up" if all(seen) else ("degraded" if all(any(flags) for flags in roles.values()) else "down")
            )
        return states

    @property
    def problems(self) -> list[str]:
        """One line per missing Ray node, per problem of a node, per replica not ready, per service not up and
        per router that is down or has taken a worker out (empty when nothing is wrong)."""
        said = [f"Ray does not report {m.host}: {m.why}" for m in self.ray_nodes_missing]
        said += [line for node in self.nodes for line in node.problems]
        said += [line for replica in self.replicas for line in replica.problems]
        for name, state in self.services.items():
            if state != "up":
                replicas = [r for r in self.replicas if r.service == name]
                ready = sum(1 for r in replicas if r.ready)
                said.append(f"service {name}: {state}, {ready} of {len(replicas)} replicas ready")
        said += [line for router in self.gateway for line in router.problems]
        said += self.edge.problems if self.edge is not None else []
        for what in ("image_id", "model_revision"):
            runs = {node.host: getattr(node, what) for node in self.nodes if getattr(node, what)}
            if len(set(runs.values())) > 1:
                listed = ", ".join(f"{host} {value[:19]}" for host, value in sorted(runs.items()))
                said.append(f"the nodes run different {what.replace('_', ' ')}s: {listed}")
        return said
