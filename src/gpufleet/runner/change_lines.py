"""The lines of a deploy or rollback report about the change itself: the rollback it ran, what clients
saw (the downtime probe of one model; the load through the edge of services), where a rolling change of
services stopped, and a stage's failures."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from gpufleet.runner.measured import Availability, Downtime
from gpufleet.runner.report import DeployReport, RollbackReport, StageResult


def change_lines(report: DeployReport) -> list[RenderableType]:
    """A rollback, what clients saw during the change (the downtime probe; services: the load through the
    edge), and where a rolling change of services stopped."""
    lines: list[RenderableType] = []
    if report.rollback is not None:
        lines.append(_rolled_back(report.rollback))
    if report.downtime is not None:
        lines.append(_downtime(report.downtime))
    if report.availability is not None:
        lines.append(_availability(report.availability))
    if (stop := report.rolling) is not None:
        back = "restored to its revision before the change" if stop.restored else "NOT restored: "
        back += "" if stop.restored else stop.restore
        line = f"rolling change stopped at replica {stop.replica} ({stop.service}, {stop.node}): {back}"
        lines.append(Text(line, style="yellow" if stop.restored else "red"))
    return lines


def _rolled_back(back: RollbackReport) -> RenderableType:
    if back.skipped:
        return Text(f"rollback: {back.skipped}", style="yellow")
    revision = back.revision
    what = "the kept revision"
    if revision is not None:
        model = (revision.model or {}).get("revision", "")[:12]
        image = revision.image_name or (revision.image_id or "")[:19]
        model = f", model {model}" if model else ""
        what = f"revision {revision.id} ({image}{model}, kept {revision.created})"
    lines = [
        Text(
            f"rollback ({back.slot}): {what}: "
            + ("serves again (model listed, completion answered)" if back.ok else "did not pass the gate"),
            style="green" if back.ok else "red",
        )
    ]
    for host, restored in back.restored.items():
        lines.append(Text(f"  {host}: " + (", ".join(restored) if restored else "already in place")))
    if not back.ok and back.stage is not None:
        lines.extend(failure_lines(back.stage))
    if not back.restarted and back.ok:
        lines.append(Text("  nothing restarted: the revision was in place and answering"))
    return Group(*lines)


def _downtime(downtime: Downtime) -> RenderableType:
    if not downtime.answered_before:
        return Text("downtime: not measured (the service did not answer when the run began)")
    after = "answers now" if downtime.answers_after else "does NOT answer now"
    return Text(
        f"downtime: {downtime.seconds:.0f} s without answers ({downtime.outages} outage(s), longest "
        f"{downtime.longest:.0f} s, polled every {downtime.interval:g} s from here); the endpoint {after}",
        style="" if downtime.answers_after else "red",
    )


def _availability(seen: Availability) -> RenderableType:
    if not seen.answered_before:
        return Text("availability: not measured (a service did not answer through the edge at the start)")

    def ms(p50: float | None, p99: float | None) -> str:
        return "-" if p50 is None or p99 is None else f"{p50:.0f}/{p99:.0f} ms"

    before, during = ms(seen.p50_before_ms, seen.p99_before_ms), ms(seen.p50_during_ms, seen.p99_during_ms)
    return Text(
        f"availability: {seen.requests} requests through the edge ({seen.streams} streams), "
        f"{seen.failed} failed, longest gap {seen.longest_gap:.1f} s; latency p50/p99 {before} "
        f"before, {during} during the change",
        style="" if seen.failed == 0 else "yellow",
    )


def failure_lines(stage: StageResult) -> list[Text]:
    """What went wrong in a stage: ansible-playbook's own error, then each failed task."""
    lines = [Text(f"{stage.name}: {stage.error}", style="red")] if stage.error else []
    for failure in stage.failures:
        what = "unreachable" if failure.unreachable else "failed"
        lines.append(
            Text(f"{failure.stage} · {failure.host} · {failure.task} {what}: {failure.message}", style="red")
        )
    return lines
