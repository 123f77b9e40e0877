"""deploy(), rollback(), teardown() and status(): gpufleet's playbooks run through ansible-runner, typed.

Each verb checks its options once (:class:`~gpufleet.runner.options.RunOptions`), makes a run plan
(:mod:`gpufleet.runner.plan`: a deploy's stages run ``playbooks/<stage>.yml`` of the project root in the
order of :data:`~gpufleet.runner.plan.STAGES`; a stage that fails stops the run and the report names the
stage, the host, the task and the message), holds the fleet (the control node's lock, the head's marker:
:mod:`gpufleet.runner.adhoc`), runs the plan owning every process it starts, and reads what the playbooks
published (:class:`~gpufleet.runner.facts.PublishedFacts`) into its report. How ansible-runner is called
lives in :mod:`gpufleet.runner.arguments`; events become results in :mod:`gpufleet.runner.events`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from gpufleet.fleet.loaded import Endpoint, Fleet, load
from gpufleet.fleet.services import not_deployable
from gpufleet.problems import InventoryError
from gpufleet.runner.adhoc import acquire, clean_hosts, head_marker
from gpufleet.runner.arguments import RunSpec, run_stages
from gpufleet.runner.availability import INTERVAL, MAX_INTERVAL, MAX_STREAMS, MIN_INTERVAL, STREAMS, LoadMeter
from gpufleet.runner.downtime import DowntimeMeter
from gpufleet.runner.events import ProgressSink
from gpufleet.runner.facts import PublishedFacts
from gpufleet.runner.fleet_lock import FleetBusyError, fleet_lock
from gpufleet.runner.head_marker import HeadMarker
from gpufleet.runner.options import DeployError, RunOptions, checked_inventory
from gpufleet.runner.owned import OwnedProcesses
from gpufleet.runner.plan import ROLLBACK_AFTER, Step, deploy_plan, spec
from gpufleet.runner.report import DeployReport, RollbackReport, StageResult, StatusReport
from gpufleet.runner.service_load import PROMQL
from gpufleet.vllm_log import PlanFigures

__all__ = ["deploy", "rollback", "status", "teardown"]


def deploy(
    inventory: Path | Fleet,
    *,
    bundle: Path | None = None,
    stages: Sequence[str] | None = None,
    extra_vars: Mapping[str, Any] | None = None,
    check: bool = False,
    limit: str | None = None,
    progress: ProgressSink | None = None,
    plan: PlanFigures | None = None,
    project_dir: Path | None = None,
    timeout: int | None = None,
    cancel: Callable[[], bool] | None = None,
    validate_inventory: bool = True,
    env_passthrough: Sequence[str] = (),
    rollback: bool = True,
    load: int = STREAMS,
    load_interval: float = INTERVAL,
) -> DeployReport:
    """Run the stages (all by default, always in :data:`STAGES` order) and report.

    A change to a serving fleet is measured (the endpoint polled from here: ``report.downtime``; for
    services, ``load`` concurrent streams of short chats through the gateway's edge, each at most one request
    per ``load_interval`` seconds: ``report.availability``, 0 = none) and gated: when a stage of
    :data:`ROLLBACK_AFTER` fails and ``rollback`` is true, every node's last healthy revision is restored and
    has to pass the gate again (``report.rollback``); the report stays not ok. A rolling change of services
    that stopped at a replica has restored that replica already (``report.rolling``): nothing else is rolled
    back then. A CPU-bound fleet (the lab) is slowed by a dense load: vLLM's CPU workers busy-poll for a
    second after each step; pace it with ``load_interval`` there.

    ``inventory`` is the inventory's path, or the :class:`~gpufleet.fleet.Fleet` that
    :func:`gpufleet.fleet.load` read from it (the CLI reads it once for its plan and for the run).

    Raises DeployError for arguments that cannot work and gpufleet.problems.InventoryError (one line per
    problem) when ``validate_inventory`` finds the inventory invalid; nothing has run on a host then.
    """
    # One reading and one validation of the inventory for the whole run: the stages, the checks, the endpoint;
    # the extra variables over it, as Ansible lays them (checked too, whichever stages run).
    _check_load(load, load_interval)
    fleet = _fleet(inventory).with_extra_vars(extra_vars)
    steps = deploy_plan(fleet.raw, stages=stages, extra_vars=extra_vars, bundle=bundle, limit=limit)
    options = RunOptions.checked(
        fleet.path, project_dir=project_dir, check=check, timeout=timeout, env_passthrough=env_passthrough
    )
    specs = steps.specs(options)
    _check_limit(fleet, limit)
    if validate_inventory:
        fleet = fleet.validate()
        refused = not_deployable(fleet.require())  # `gpufleet validate`'s checks, then what no deploy does
        if refused:
            raise InventoryError(refused)
    started = time.monotonic()
    # Every replica of services keeps its revisions: a failed change rolls them all back, as the one instance.
    # The downtime probe polls the one endpoint of an inventory before services; the edge's model list answers
    # whatever its replicas do, so services are measured by a load through the edge instead.
    services = fleet.spec is not None and bool(fleet.spec.services)
    gated = not check and any(stage in ROLLBACK_AFTER for stage in steps.stages)
    action = "check" if check else "deploy"
    restored: RollbackReport | None = None
    measured = fleet.endpoint if gated and not services else None
    with (
        _one_run(fleet.path, action),
        _downtime_meter(measured) as meter,
        _load_meter(fleet, load if gated else 0, load_interval) as loaded,
    ):
        marker = head_marker(specs, action, fleet.control)
        warnings = acquire(marker)
        results, facts = _run(specs, progress, cancel, marker, control=fleet.control)
        failed = next((result.name for result in results if result.status != "ok"), None)
        stopped = facts.rolling is not None and facts.rolling.restored
        if rollback and gated and failed in ROLLBACK_AFTER and results[-1].status == "failed" and not stopped:
            restored = _rollback(
                options, "current", progress, cancel, marker, required=False, control=fleet.control
            )
    report = DeployReport(
        ok=failed is None,
        check_mode=check,
        seconds=round(time.monotonic() - started, 3),
        stages=tuple(results),
        failed_stage=failed,
        # with services each replica says its own (``replicas``; none on the fast path, where serve ran on no
        # node): the last one published is not the fleet's; the fleet's is the gateway's edge
        endpoint=facts.gateway_endpoint if services else facts.endpoint,
        served_model=None if services else facts.served_model,
        vllm=None if services else facts.vllm,
        verify=facts.verify,
        warnings=tuple(warnings),
        monitoring=facts.monitoring,
        downtime=meter.result() if meter is not None else None,
        rollback=restored,
        replicas=facts.replicas,
        availability=loaded.result() if loaded is not None else None,
        rolling=facts.rolling,
    )
    return report.compared_with(plan) if plan is not None else report


def rollback(
    inventory: Path | Fleet,
    *,
    to: Literal["current", "previous"] = "previous",
    progress: ProgressSink | None = None,
    project_dir: Path | None = None,
    timeout: int | None = None,
    cancel: Callable[[], bool] | None = None,
    load: int = STREAMS,
    load_interval: float = INTERVAL,
) -> DeployReport:
    """Restore every node's ``previous`` revision (or ``current``: the last healthy one, after a change that
    failed outside deploy()), restart what changed and pass the health gate again (playbooks/rollback.yml).
    Measured as deploy() measures a change (``load``, ``load_interval``: services' load through the edge)."""
    _check_load(load, load_interval)
    fleet = _fleet(inventory)
    options = RunOptions.checked(fleet.path, project_dir=project_dir, timeout=timeout)
    first = spec(Step("rollback"), options)
    started = time.monotonic()
    measured = None if fleet.lists_services else fleet.endpoint  # services: see deploy()
    # the edge and the services' names come from the typed fleet: read unchecked, the fleet has none
    typed = fleet.validate() if fleet.lists_services and load > 0 else fleet
    with (
        _one_run(fleet.path, "rollback"),
        _downtime_meter(measured) as meter,
        _load_meter(typed, load, load_interval) as loaded,
    ):
        marker = head_marker([first], "rollback", fleet.control)
        warnings = acquire(marker)
        restored = _rollback(
            options, to, progress, cancel, marker, required=True, acquired=True, control=fleet.control
        )
    stage = restored.stage or StageResult(name="rollback", status="failed", seconds=0.0)
    return DeployReport(
        ok=restored.ok,
        seconds=round(time.monotonic() - started, 3),
        stages=(stage,),
        failed_stage=None if restored.ok else "rollback",
        warnings=tuple(warnings),
        downtime=meter.result() if meter is not None else None,
        rollback=restored,
        availability=loaded.result() if loaded is not None else None,
    )


def teardown(
    inventory: Path | Fleet,
    *,
    limit: str | None = None,
    extra_vars: Mapping[str, Any] | None = None,
    progress: ProgressSink | None = None,
    project_dir: Path | None = None,
    timeout: int | None = None,
    cancel: Callable[[], bool] | None = None,
) -> DeployReport:
    """Stop the services (``playbooks/teardown.yml``); images, models and packages stay."""
    fleet = _fleet(inventory)
    options = RunOptions.checked(fleet.path, project_dir=project_dir, timeout=timeout)
    run = spec(Step("teardown", dict(extra_vars or {}), limit), options)
    _check_limit(fleet, limit)
    started = time.monotonic()
    with _one_run(fleet.path, "teardown"):
        marker = head_marker([run], "teardown", fleet.control)
        warnings = acquire(marker)
        results, _ = _run([run], progress, cancel, marker, control=fleet.control)
    ok = results[0].status == "ok"
    return DeployReport(
        ok=ok,
        seconds=round(time.monotonic() - started, 3),
        stages=tuple(results),
        failed_stage=None if ok else "teardown",
        warnings=tuple(warnings),
    )


def status(
    inventory: Path,
    *,
    limit: str | None = None,
    progress: ProgressSink | None = None,
    project_dir: Path | None = None,
    timeout: int | None = None,
    cancel: Callable[[], bool] | None = None,
) -> StatusReport:
    """Ray and vLLM as they run now (``playbooks/status.yml``, read-only); for services, every replica and
    each service up, degraded or down (``StatusReport.services``)."""
    options = RunOptions.checked(inventory, project_dir=project_dir, timeout=timeout)
    run = spec(Step("status", {"gpufleet_status_promql": PROMQL}, limit), options)
    results, facts = _run([run], progress, cancel)
    alive, expected = facts.ray_nodes_alive, facts.ray_nodes_expected
    ready = facts.vllm_ready
    ok = results[0].status == "ok" and ready and (alive is None or expected is None or alive >= expected)
    services = bool(facts.replica_states)  # services: each replica's own state, no one endpoint
    report = StatusReport(
        ok=ok,
        ray_nodes_alive=None if alive is None else int(alive),
        ray_nodes_expected=None if expected is None else int(expected),
        ray_gpus=facts.ray_gpus,
        vllm_ready=ready,
        endpoint=facts.gateway_endpoint if services else facts.endpoint,
        served_model=None if services else facts.served_model,
        vllm=None if services else facts.vllm,
        stage=results[0],
        ray_nodes_missing=facts.ray_nodes_missing,
        nodes=facts.nodes,
        vllm_facts_stale=not services and not ready and facts.vllm is not None,
        load=facts.service_load if ready and not services else None,
        gateway=facts.gateway,
        replicas=facts.replica_states,
        edge=facts.gateway_edge if services else None,
    )
    # Missing Ray nodes, a node's problems, nodes that run different images or model commits (version
    # skew): every line of report.problems makes the service not healthy.
    return report.model_copy(update={"ok": False}) if report.ok and report.problems else report


def _rollback(
    options: RunOptions,
    slot: Literal["current", "previous"],
    progress: ProgressSink | None,
    cancel: Callable[[], bool] | None,
    marker: HeadMarker | None,
    *,
    required: bool,
    acquired: bool = False,
    control: str | None = None,
) -> RollbackReport:
    """Run playbooks/rollback.yml for ``slot`` and read what it published (``gpufleet_rollback``)."""
    # Not the failed run's -e values nor its limit: the restored revision brings its own settings.
    step = Step("rollback", {"gpufleet_revision_slot": slot, "gpufleet_revision_required": required})
    try:
        run = spec(step, replace(options, check=False))
    except DeployError as missing:  # a project without the playbook (a custom project_dir)
        if required:
            raise
        return RollbackReport(slot=slot, ok=False, skipped=str(missing))
    if not acquired:
        try:  # the run's marker was released with its stages; the rollback holds it again
            acquire(marker)
        except DeployError as busy:
            return RollbackReport(slot=slot, ok=False, skipped=str(busy))
    results, facts = _run([run], progress, cancel, marker, control=control)
    stage = results[0] if results else None
    published = facts.rollback
    if published is None:
        done = stage is not None and stage.status == "ok"
        why = f"no {slot} revision kept yet (no deploy of this fleet has passed its health gate)"
        return RollbackReport(slot=slot, ok=False, skipped=why if done else None, stage=stage)
    return RollbackReport(
        slot=slot,
        ok=stage is not None and stage.status == "ok",
        revision=published.revision,
        restarted=published.restarted,
        restored=published.restored,
        stage=stage,
    )


def _run(
    specs: Sequence[RunSpec],
    progress: ProgressSink | None,
    cancel: Callable[[], bool] | None,
    marker: HeadMarker | None = None,
    *,
    control: str | None = None,
) -> tuple[list[StageResult], PublishedFacts]:
    """run_stages, owning the processes the run starts: none outlives it here, nor (canceled) on the hosts.

    The marker on the control host ``control`` (when ``marker`` holds one) is removed at the end: by the host
    cleanup after a cancel (one round trip within CANCEL_SECONDS), else on its own."""
    started = time.time()
    run_id = marker.holder.run_id if marker is not None and marker.written else ""
    canceled = False
    try:
        with OwnedProcesses() as owned:
            results, published = run_stages(specs, progress, cancel)
        canceled = bool(results) and results[-1].status == "canceled"
        if canceled and specs:
            clean_hosts(specs[-1], started, owned.deadline(), run_id, control=control)
    finally:
        if run_id and marker is not None and not canceled:
            with contextlib.suppress(Exception):  # best effort: a marker left is stale once the run is gone
                marker.release()
    return results, PublishedFacts.read(published)


@contextlib.contextmanager
def _downtime_meter(target: Endpoint | None) -> Iterator[DowntimeMeter | None]:
    """Polls the service's endpoint (URL, API key file) while the block runs; None: not measured."""
    if target is None:
        yield None
        return
    with DowntimeMeter(*target) as meter:
        yield meter


@contextlib.contextmanager
def _load_meter(fleet: Fleet, streams: int, interval: float) -> Iterator[LoadMeter | None]:
    """Services: ``streams`` streams of short chats (each at most one per ``interval`` seconds) to every
    service through the edge while the block runs; None: not measured (one model, no edge, or no streams)."""
    edge = fleet.edge
    if streams <= 0 or edge is None or fleet.spec is None:
        yield None
        return
    models = [service.serving.served_model_name or service.name for service in fleet.spec.services]
    with LoadMeter(edge.url, edge.key_file, models, streams=streams, interval=interval) as meter:
        yield meter


@contextlib.contextmanager
def _one_run(inventory: Path, action: str) -> Iterator[None]:
    """The fleet's lock (:mod:`gpufleet.runner.fleet_lock`); a held lock is a DeployError."""
    try:
        with fleet_lock(inventory, action):
            yield
    except FleetBusyError as busy:
        raise DeployError(str(busy)) from None


def _fleet(inventory: Path | Fleet) -> Fleet:
    """The run's fleet: the one passed in, or read (not yet checked) from the path."""
    checked_inventory(inventory.path if isinstance(inventory, Fleet) else inventory)
    return inventory if isinstance(inventory, Fleet) else load(inventory, validate=False)


def _check_limit(fleet: Fleet, limit: str | None) -> None:
    """A --limit part that selects no host is a DeployError (Ansible warns, then runs on the rest, or on no
    host at all and reports success)."""
    unmatched = fleet.unmatched(limit) if limit and fleet.raw is not None else []
    if unmatched:
        hosts = ", ".join(host.name for host in fleet.raw.hosts) if fleet.raw is not None else ""
        raise DeployError(
            f"command line: --limit: found {', '.join(unmatched)}, which selects no host of {fleet.path}; "
            f"expected host names, groups or patterns of the inventory (hosts: {hosts}). "
            "Fix: correct the pattern (a typo?), or leave --limit out to run on every host"
        )


def _check_load(streams: int, interval: float) -> None:
    """The load's streams and pace, before anything runs: a stream without a pause would flood the edge."""
    whole = isinstance(streams, int) and not isinstance(streams, bool)
    paced = isinstance(interval, int | float) and MIN_INTERVAL <= interval <= MAX_INTERVAL
    if not whole or not 0 <= streams <= MAX_STREAMS or (streams > 0 and not paced):
        raise DeployError(
            f"deploy()/rollback(): load={streams!r}, load_interval={interval!r}: found a number of streams "
            f"outside 0-{MAX_STREAMS} or a pause outside {MIN_INTERVAL}-{MAX_INTERVAL:g} s; expected load "
            f"from 0 (no load) to {MAX_STREAMS} and load_interval from {MIN_INTERVAL} to {MAX_INTERVAL:g} s. "
            f"Fix: pass load_interval={INTERVAL} (the default) or more, or load=0"
        )
