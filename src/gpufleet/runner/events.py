"""Turn the events ansible-runner streams for one stage into a StageResult and the facts it published.

The event dicts are ansible-runner's (``event``, ``event_data`` with ``host``, ``task``, ``res``, ...);
tests/unit/data/runner_events/ holds recorded ones. Only ``res`` of failed results is read for messages,
and ansible-runner replaces the whole ``res`` of a ``no_log`` task before the event reaches us.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from gpufleet.runner.report import Failure, HostResult, StageResult, StageStatus

# Facts a stage may publish for the report (the contract: gpufleet.runner.facts' docstring).
PUBLISHED_FACTS = frozenset(
    {
        "gpufleet_endpoint",
        "gpufleet_vllm_facts",
        "gpufleet_vllm_ready",
        "gpufleet_ray_nodes_alive",
        "gpufleet_ray_nodes_expected",
        "gpufleet_ray_gpus",
        "gpufleet_ray_nodes_missing",
        "gpufleet_nodes",
        "gpufleet_verify",
        "gpufleet_service_load",
        "gpufleet_gateway",
        "gpufleet_gateway_endpoint",
        "gpufleet_gateway_edge",
        "gpufleet_monitoring_endpoints",
        "gpufleet_rollback",
        "gpufleet_rolling",
        "gpufleet_replicas",
        "gpufleet_replica_states",
    }
)
# Facts each host publishes a part of (by key): the report takes them all.
MERGED_FACTS = frozenset({"gpufleet_replicas"})
_RESULTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
}
_STAT_KEYS = {
    "ok": "ok",
    "changed": "changed",
    "failures": "failed",
    "dark": "unreachable",
    "skipped": "skipped",
    "rescued": "rescued",
    "ignored": "ignored",
}
_MESSAGE_LIMIT = 2000
_STOPPED = {
    "canceled": "canceled while running (interrupted)",
    "timeout": "stopped: the stage ran past its timeout",
}


class ProgressSink(Protocol):
    """Receives a run's progress as it happens (gpufleet.runner.progress.LiveProgress draws it)."""

    def stage_started(self, stage: str) -> None: ...
    def task_started(self, stage: str, host: str, task: str) -> None: ...
    def task_done(self, stage: str, host: str, outcome: str) -> None: ...
    def failed(self, failure: Failure) -> None: ...
    def stage_finished(self, result: StageResult) -> None: ...


@dataclass
class _Host:
    counts: dict[str, int] = field(default_factory=dict)
    first: datetime | None = None
    last: datetime | None = None
    failures: list[Failure] = field(default_factory=list)
    standing: list[Failure] | None = None  # what ended the host's run, when known without a recap

    def add(self, outcome: str, data: Mapping[str, Any]) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        start, end = _time(data.get("start")), _time(data.get("end"))
        if start and (self.first is None or start < self.first):
            self.first = start
        if end and (self.last is None or end > self.last):
            self.last = end

    def seconds(self) -> float:
        return round((self.last - self.first).total_seconds(), 3) if self.first and self.last else 0.0


NOTHING_RAN = "ansible-playbook failed before any task ran"
# Seen in the lab (rehearsal of 2026-12-02): a task that failed and was rescued on one host of a play with
# any_errors_fatal ended the play on the other hosts, and ansible-playbook exited 2 with no failure standing.
RAN_BUT_FAILED = (
    "ansible-playbook exited as failed, but no host's failure stood (its tasks ran: see the counts); "
    "a failure that a rescue handled still ends a play with any_errors_fatal on every host"
)


class StageRecorder:
    """The ``event_handler`` for one stage's ansible-runner run."""

    def __init__(self, stage: str, progress: ProgressSink | None = None) -> None:
        self.stage = stage
        self.progress = progress
        self.facts: dict[str, tuple[str, Any]] = {}
        self._hosts: dict[str, _Host] = {}
        self._stats: Mapping[str, Any] | None = None
        self._output: list[str] = []

    def __call__(self, event: Mapping[str, Any]) -> bool:
        """Record one event; returns False so that ansible-runner writes no artifact for it."""
        kind = str(event.get("event", ""))
        data: Mapping[str, Any] = event.get("event_data") or {}
        if kind == "runner_on_start" and self.progress:
            self.progress.task_started(self.stage, str(data.get("host")), str(data.get("task")))
        elif kind in _RESULTS:
            self._result(kind, data)
        elif kind == "playbook_on_stats":
            self._stats = data
        elif kind in ("verbose", "error") and event.get("stdout"):
            self._output.append(str(event["stdout"]))
        return False

    def _result(self, kind: str, data: Mapping[str, Any]) -> None:
        host = str(data.get("host"))
        res: Mapping[str, Any] = data.get("res") or {}
        outcome = _RESULTS[kind]
        if outcome == "failed" and data.get("ignore_errors"):
            outcome = "ignored"
        elif outcome == "ok" and res.get("changed"):
            outcome = "changed"
        record = self._hosts.setdefault(host, _Host())
        record.add(outcome, data)
        if outcome in ("ok", "changed"):
            for name, value in (res.get("ansible_facts") or {}).items():
                if name in MERGED_FACTS and isinstance(value, Mapping):
                    _, before = self.facts.get(name, (host, {}))
                    self.facts[name] = (host, {**(before if isinstance(before, Mapping) else {}), **value})
                elif name in PUBLISHED_FACTS:
                    self.facts[name] = (host, value)
        if outcome in ("failed", "unreachable"):
            failure = Failure(
                stage=self.stage,
                host=host,
                task=str(data.get("task", "")),
                message=failure_message(res),
                unreachable=outcome == "unreachable",
            )
            record.failures.append(failure)
            if self.progress:
                self.progress.failed(failure)
        if self.progress:
            self.progress.task_done(self.stage, host, outcome)

    def result(
        self, status: StageStatus, seconds: float, failed_hosts: frozenset[str] | None = None
    ) -> StageResult:
        """The stage's result. Without Ansible's recap (a stage of a longer run: ``failed_hosts`` names the
        hosts that ended the stage failed), a failed host's failure is its last one, as the recap counts."""
        if failed_hosts is not None:
            for name, host in self._hosts.items():
                host.standing = host.failures[-1:] if name in failed_hosts else []
        hosts = tuple(self._host_result(name, host) for name, host in sorted(self._hosts.items()))
        for name in sorted(self._stat_hosts() - set(self._hosts)):
            hosts += (self._host_result(name, _Host()),)
        failures = tuple(f for name, host in sorted(self._hosts.items()) for f in self._final(name, host))
        error = None
        if status != "ok" and not failures:
            ran = any(host.ok or host.failed or host.rescued for host in hosts)
            error = _STOPPED.get(status) or self._error() or (RAN_BUT_FAILED if ran else NOTHING_RAN)
        return StageResult(
            name=self.stage,
            status=status,
            seconds=round(seconds, 3),
            hosts=hosts,
            failures=failures,
            error=error,
        )

    def _host_result(self, name: str, host: _Host) -> HostResult:
        if self._stats is None:
            counts = dict(host.counts)
            # As in Ansible's recap, changed and ignored-failed results are also "ok".
            counts["ok"] = counts.get("ok", 0) + counts.get("changed", 0) + counts.get("ignored", 0)
            counts["failed"] = counts.get("failed", 0)
            if host.standing is not None:  # as the recap: a rescued failure is "rescued", not "failed"
                standing = sum(not failure.unreachable for failure in host.standing)
                counts["rescued"] = counts["failed"] - standing
                counts["failed"] = standing
        else:
            counts = {
                field: int((self._stats.get(key) or {}).get(name, 0)) for key, field in _STAT_KEYS.items()
            }
        return HostResult(host=name, seconds=host.seconds(), **counts)

    def _final(self, name: str, host: _Host) -> list[Failure]:
        """The failures that stood: a rescued one is followed by more tasks, a real one ends the host's run,
        so Ansible's recap count N means the host's last N failures."""
        if self._stats is None:
            return host.failures if host.standing is None else host.standing
        failed = [f for f in host.failures if not f.unreachable]
        unreachable = [f for f in host.failures if f.unreachable]
        keep_failed = int((self._stats.get("failures") or {}).get(name, 0))
        keep_unreachable = int((self._stats.get("dark") or {}).get(name, 0))
        kept = failed[len(failed) - keep_failed :] if keep_failed else []
        kept += unreachable[len(unreachable) - keep_unreachable :] if keep_unreachable else []
        return kept

    def _stat_hosts(self) -> set[str]:
        if self._stats is None:
            return set()
        return {host for key in _STAT_KEYS for host in (self._stats.get(key) or {})}

    def _error(self) -> str | None:
        """ansible-playbook's own error ("[ERROR]: ..." in 2.19, "ERROR! ..." before) and the lines after."""
        lines = [line.strip() for chunk in self._output for line in chunk.splitlines() if line.strip()]
        start = next((i for i, line in enumerate(lines) if line.startswith(("[ERROR]", "ERROR!"))), None)
        return " ".join(lines[start : start + 2])[:_MESSAGE_LIMIT] if start is not None else None


def failure_message(res: Mapping[str, Any]) -> str:
    """The ``msg`` and ``stderr`` of a failed result (or of its failed loop items)."""
    if "censored" in res:
        return str(res["censored"])
    parts = []
    if msg := res.get("msg"):
        parts.append(str(msg).strip() + (f" (rc {res['rc']})" if res.get("rc") not in (None, 0) else ""))
    if stderr := res.get("stderr"):
        parts.append(str(stderr).strip())
    for item in res.get("results") or ():
        if isinstance(item, Mapping) and (item.get("failed") or "censored" in item):
            parts.append(failure_message(item))
            break
    if not parts and (stdout := res.get("stdout")):
        parts.append(str(stdout).strip())
    message = ": ".join(parts) or "failed without a message"
    if len(message) <= _MESSAGE_LIMIT:
        return message
    # The head says what failed; the tail is where a log shown in the message has its last lines (the crash).
    tail = _MESSAGE_LIMIT * 2 // 5
    return message[: _MESSAGE_LIMIT - tail - 3] + "\n…\n" + message[-tail:]


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None
