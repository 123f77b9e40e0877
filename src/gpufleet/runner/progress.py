"""What a person sees: a live table while stages run, and the report at the end (rich).

Everything shown comes from the recorded results (task names, counts, failure messages); a ``no_log``
task's result reaches this module only as ansible-runner's "output has been hidden" notice.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpufleet.runner.change_lines import change_lines, failure_lines
from gpufleet.runner.report import (
    DeployReport,
    Failure,
    ReplicaReport,
    ServiceLoad,
    StageResult,
    StatusReport,
    VerifyResult,
)
from gpufleet.vllm_log import VllmFacts

_FAST = {False: "", True: "; every node as the last deploy left it, so only verify's checks ran"}
_NO_HOST = {False: "no host matched", True: "every node as the last deploy left it: nothing to do"}
_COLUMNS = ("ok", "changed", "failed", "skipped")
_STYLE = {"ok": "green", "failed": "bold red", "canceled": "yellow", "timeout": "yellow", "running": "cyan"}
# Live counts follow Ansible's recap: changed and ignored-failed results are also "ok".
_COUNTED_AS = {
    "ok": ("ok",),
    "changed": ("ok", "changed"),
    "ignored": ("ok",),
    "failed": ("failed",),
    "unreachable": ("failed",),
    "skipped": ("skipped",),
}
_FACTS = (
    ("weights_gib", "weights per GPU", "{:.2f} GiB"),
    ("kv_cache_gib", "KV-cache memory per GPU", "{:.2f} GiB"),
    ("kv_cache_tokens", "KV-cache tokens", "{:,}"),
    ("max_concurrency", "maximum concurrency", "{:.2f}x"),
    ("load_seconds", "model load", "{:.1f} s"),
    ("ready_seconds", "start to ready", "{:.1f} s"),
)


@dataclass
class _Row:
    stage: str
    host: str
    task: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    state: str = "running"


class LiveProgress:
    """A ProgressSink that draws one row per stage and host, and prints failures as they happen.

    On a terminal the table is redrawn live. Elsewhere (a CI log, ``| tee``) a live table would only appear
    when everything is over, so each stage prints one line when it starts and one per host when it ends.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._plain = not self.console.is_terminal
        self._rows: dict[tuple[str, str], _Row] = {}
        self._lock = threading.Lock()
        self._live = Live(console=self.console, get_renderable=self._render, refresh_per_second=4)

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._live.is_started:
            self._live.stop()

    def stage_started(self, stage: str) -> None:
        if self._plain:
            self.console.print(f"{stage}: started")
        # The table appears with the first stage: a run refused before any stage shows none.
        elif not self._live.is_started:
            self._live.start()
        with self._lock:
            self._rows[(stage, "")] = _Row(stage, "", task="starting")

    def task_started(self, stage: str, host: str, task: str) -> None:
        with self._lock:
            self._rows.pop((stage, ""), None)
            self._rows.setdefault((stage, host), _Row(stage, host)).task = task

    def task_done(self, stage: str, host: str, outcome: str) -> None:
        with self._lock:
            row = self._rows.setdefault((stage, host), _Row(stage, host))
            for column in _COUNTED_AS.get(outcome, ()):
                row.counts[column] = row.counts.get(column, 0) + 1

    def failed(self, failure: Failure) -> None:
        label = "UNREACHABLE " if failure.unreachable else "FAILED "
        line = Text.assemble(
            (label, "bold red"), f"{failure.stage} · {failure.host} · {failure.task}: ", failure.message
        )
        self._live.console.print(line)

    def stage_finished(self, result: StageResult) -> None:
        now = time.monotonic()
        with self._lock:
            self._rows.pop((result.name, ""), None)
            for host in result.hosts:
                row = self._rows.setdefault((result.name, host.host), _Row(result.name, host.host))
                row.counts = {
                    "ok": host.ok,
                    "changed": host.changed,
                    "failed": host.failed + host.unreachable,
                    "skipped": host.skipped,
                }
                row.state = "failed" if host.failed or host.unreachable else result.status
                row.ended, row.task = now, ""
            if not result.hosts:
                self._rows[(result.name, "")] = _Row(  # started then too: not "in -0s"
                    result.name,
                    "",
                    started=now,
                    ended=now,
                    state=result.status,
                    task=result.error or _NO_HOST[result.in_sync],
                )
            finished = [row for row in self._rows.values() if row.stage == result.name]
        if self._plain:
            for row in finished:
                counts = " ".join(f"{k}={row.counts.get(k, 0)}" for k in _COLUMNS)
                where = f" {row.host}" if row.host else ""
                detail = f" ({row.task})" if row.task else ""
                self.console.print(
                    f"{row.stage}:{where} {row.state} in {now - row.started:.0f}s {counts}{detail}",
                    highlight=False,
                )

    def _render(self) -> RenderableType:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("stage", "host", "task", "elapsed", "ok", "changed", "failed", "skipped", "state"):
            table.add_column(
                column, justify="left" if column in ("stage", "host", "task", "state") else "right"
            )
        now = time.monotonic()
        with self._lock:
            for row in self._rows.values():
                table.add_row(
                    row.stage,
                    row.host,
                    Text(row.task, overflow="ellipsis", no_wrap=True),
                    f"{(row.ended or now) - row.started:.0f}s",
                    *(str(row.counts.get(k, 0)) for k in ("ok", "changed", "failed", "skipped")),
                    Text(row.state, style=_STYLE.get(row.state, "")),
                )
        return table


def print_deploy_report(console: Console, report: DeployReport) -> None:
    """The end-of-run summary: stages, failures, the endpoint, vLLM's facts, warnings against the plan."""
    table = Table(title="gpufleet " + ("check" if report.check_mode else "run"), header_style="bold")
    for column in ("stage", "status", "time", "hosts", "ok", "changed", "failed", "unreachable"):
        table.add_column(column, justify="left" if column in ("stage", "status") else "right")
    for stage in report.stages:
        table.add_row(
            stage.name,
            Text(stage.status, style=_STYLE.get(stage.status, "")),
            f"{stage.seconds:.0f}s",
            str(len(stage.hosts)),
            *(
                str(sum(getattr(h, key) for h in stage.hosts))
                for key in ("ok", "changed", "failed", "unreachable")
            ),
        )
    console.print(table)
    console.print(_details(report.stages, report.endpoint, report.served_model, report.vllm))
    console.print(Group(*(_replica_line(replica) for replica in report.replicas)))
    if report.verify is not None:
        console.print(_verified(report.verify))
    if (monitoring := report.monitoring) is not None:
        grafana = f", Grafana {monitoring.grafana}" if monitoring.grafana else ""
        up = f"{monitoring.targets_up} targets up"
        console.print(f"monitoring: Prometheus {monitoring.prometheus}{grafana} ({up})")
    for warning in report.warnings:
        console.print(Text("warning: " + warning, style="yellow"))
    for line in change_lines(report):
        console.print(line)
    outcome = "deployed" + (" (no changes)" if report.changed == 0 and not report.check_mode else "")
    outcome += _FAST[any(stage.in_sync for stage in report.stages)]
    if (back := report.rollback) is not None:
        if report.failed_stage in (None, "rollback"):  # gpufleet rollback
            outcome = "rolled back" if back.ok else "the rollback failed"
        elif back.ok and not back.restarted and not any(back.restored.values()):
            outcome = f"failed in stage {report.failed_stage}; the running revision was untouched and answers"
        elif back.ok:
            outcome = f"failed in stage {report.failed_stage}; rolled back"
        else:
            why = f"not rolled back: {back.skipped}" if back.skipped else "the rollback failed too"
            outcome = f"failed in stage {report.failed_stage}; {why}"
    console.print(
        Text(
            outcome if report.ok or report.rollback is not None else f"failed in stage {report.failed_stage}",
            style="bold green" if report.ok else "bold red",
        )
    )


def _verified(verify: VerifyResult) -> RenderableType:
    lines = [Text(f"verify: completion {verify.completion!r} ({verify.completion_tokens} tokens)")]
    if verify.unauthorized_status is not None:
        lines.append(Text(f"verify: without the API key: HTTP {verify.unauthorized_status}"))
    lines.append(Text("verify: /metrics " + ("answers" if verify.metrics else "did not answer")))
    if verify.benchmark:
        figures = ", ".join(f"{name} {value:g}" for name, value in verify.benchmark.items())
        lines.append(Text("verify: benchmark " + figures))
    return Group(*lines)


def print_status_report(console: Console, report: StatusReport) -> None:
    """Ray's nodes (the missing ones by name), vLLM, each node's problems, stale figures marked stale."""
    if not report.replicas:  # services run no Ray (playbooks/cluster.yml)
        ray = "unknown" if report.ray_nodes_alive is None else f"{report.ray_nodes_alive}"
        if report.ray_nodes_expected is not None:
            ray += f" of {report.ray_nodes_expected}"
        if report.ray_nodes_missing:
            ray += "; missing: " + ", ".join(node.host for node in report.ray_nodes_missing)
        console.print(f"Ray nodes alive: {ray}" + (f", {report.ray_gpus:g} GPUs" if report.ray_gpus else ""))
    console.print(f"vLLM ready: {'yes' if report.vllm_ready else 'no'}")
    for name, state in report.services.items():
        console.print(f"service {name}: {state}", highlight=False)
        for replica in (r for r in report.replicas if r.service == name):
            gpus = ",".join(str(gpu) for gpu in replica.gpus) or "-"
            ready = "ready" if replica.ready else f"not ready (unit {replica.unit})"
            role = f"{replica.role}, " if replica.role else ""
            line = f"  {replica.id} on {replica.node} ({role}GPUs {gpus}) {replica.url}: {ready}"
            console.print(line, highlight=False)
    if report.load is not None:
        console.print(_load_line(report.load), highlight=False)
    for node in report.nodes:
        if node.image_id or node.model_revision or node.config_sha256:
            runs = [
                f"image {node.image_id.removeprefix('sha256:')[:12]}" if node.image_id else "",
                f"model {node.model_revision[:12]}" if node.model_revision else "",
                f"config {node.config_sha256[:12]}" if node.config_sha256 else "",
            ]
            console.print(f"{node.host}: " + ", ".join(part for part in runs if part), highlight=False)
    if (edge := report.edge) is not None:
        answer = "no answer" if edge.status <= 0 else f"HTTP {edge.status}"
        listed = f", lists {', '.join(edge.models)}" if edge.models else ""
        console.print(f"gateway edge {edge.url}: {answer}{listed}", highlight=False)
    for router in report.gateway:
        healthy = sum(1 for worker in router.workers if worker in router.healthy)
        seen = f"{healthy} of {len(router.workers)} workers healthy" if router.answered else "no metrics"
        line = f"gateway {router.service} (port {router.port}): router {router.active}, {seen}"
        console.print(line, highlight=False)
    stale = report.vllm_facts_stale
    console.print(_details((report.stage,), report.endpoint, report.served_model, report.vllm, stale=stale))
    for line in report.problems:
        console.print(Text(line, style="red"), highlight=False)
    notes = sorted({f"{node.gpu_note} ({node.host})" for node in report.nodes if node.gpu_note})
    for note in notes:
        console.print(Text("GPU memory check skipped: " + note, style="yellow"), highlight=False)
    console.print(
        Text("healthy" if report.ok else "not healthy", style="bold green" if report.ok else "bold red")
    )


def _load_line(load: ServiceLoad) -> str:
    """One line of what vLLM does now, with where the figures come from."""

    def shown(value: float | None, shape: str) -> str:
        return "n/a" if value is None else shape.format(value)

    origin = f"Prometheus, last {load.window}" if load.source == "prometheus" else f"/metrics, {load.window}"
    ttft = f"TTFT p50 {shown(load.ttft_p50_s, '{:.3f} s')}, p99 {shown(load.ttft_p99_s, '{:.3f} s')}"
    if load.ttft_window and load.ttft_window != load.window:
        ttft += f" ({load.ttft_window})"
    return (
        f"load ({origin}): {shown(load.requests_running, '{:g}')} running, "
        f"{shown(load.requests_waiting, '{:g}')} waiting, KV cache {shown(load.kv_cache_usage, '{:.1%}')}, "
        f"prompt {shown(load.prompt_tokens_per_s, '{:.1f}')} tok/s, "
        f"generation {shown(load.generation_tokens_per_s, '{:.1f}')} tok/s, {ttft}"
    )


def _grouped(whys: dict[str, str]) -> dict[str, list[str]]:
    """The hosts that share each reason, in the order the reasons first appear."""
    grouped: dict[str, list[str]] = {}
    for host, why in whys.items():
        grouped.setdefault(why, []).append(host)
    return grouped


def _replica_line(replica: ReplicaReport) -> Text:
    """One replica of a service: where it serves and what its vLLM reported at start-up."""
    gpus = ",".join(str(gpu) for gpu in replica.gpus) or "none (CPU)"
    text = f"replica {replica.id} ({replica.service}) on {replica.node}: {replica.url}, GPUs {gpus}"
    if (vllm := replica.vllm) is not None:
        if vllm.kv_cache_tokens is not None:
            text += f", KV-cache tokens {vllm.kv_cache_tokens:,}"
        if vllm.ready_seconds is not None:
            text += f", ready in {vllm.ready_seconds:.0f} s"
    return Text(text)


def _details(
    stages: tuple[StageResult, ...],
    endpoint: str | None,
    model: str | None,
    vllm: VllmFacts | None,
    *,
    stale: bool = False,
) -> RenderableType:
    lines: list[RenderableType] = []
    for stage in stages:
        lines.extend(failure_lines(stage))
        # why a whole deploy did not take the fast path (the fleet check's answer on each node out of sync)
        for why, hosts in _grouped(stage.not_in_sync).items():
            lines.append(Text(f"every stage ran because of {', '.join(hosts)}: {why}"))
        if stage.retried:
            lines.append(Text(f"{stage.name} ran twice: its first run failed only through {stage.retried}"))
    if endpoint:
        lines.append(Text(f"endpoint: {endpoint}" + (f" (model {model})" if model else ""), style="bold"))
    if vllm is not None:
        if stale:
            lines.append(Text("vLLM is not serving: these figures are stale", style="yellow"))
        for name, label, shape in _FACTS:
            if (value := getattr(vllm, name)) is not None:
                mark = " (stale: last run; vLLM is down)" if stale else ""
                text = f"vLLM {label}: " + shape.format(value) + mark
                lines.append(Text(text, style="dim" if stale else ""))
    return Group(*lines)
