"""deploy(), status() and teardown(): gpufleet's playbooks run through ansible-runner, typed.

Each stage runs ``playbooks/<stage>.yml`` of the project root (``$GPUFLEET_HOME`` or the checkout this
package runs from), in the order of :data:`STAGES`; a stage that fails stops the run and the report names
the stage, the host, the task and the message. How ansible-runner is called (arguments, environment
allow-list, signals) lives in :mod:`gpufleet.runner.arguments`; events become results in
:mod:`gpufleet.runner.events`.

Contract with the playbooks (what the report reads). A task publishes a fact for the report by setting it
with ``ansible.builtin.set_fact`` (``cacheable`` or not) without ``no_log``; the report takes the last
value set by any host in the run:

- ``gpufleet_endpoint``: the OpenAI-compatible base URL, e.g. ``http://10.10.0.10:8000/v1`` (serve,
  status).
- ``gpufleet_vllm_facts``: a mapping with the fields of :class:`gpufleet.vllm_log.VllmFacts`, as the
  ``gpufleet_vllm_facts`` filter (plugins/filter/gpufleet_vllm.py) makes from vLLM's start-up log, plus
  ``served_model_name`` (serve, status). Other keys are ignored.
- ``gpufleet_vllm_ready``: true when /v1/models lists the served model (status).
- ``gpufleet_ray_nodes_alive``, ``gpufleet_ray_nodes_expected``, ``gpufleet_ray_gpus``: from ``ray
  status`` on the head and the inventory (status).
- ``gpufleet_ray_nodes_missing``: the inventory nodes Ray does not report alive, each a mapping with ``host``
  and ``why`` (status).
- ``gpufleet_nodes``: per serving node (a mapping by inventory name): ``container`` (Docker's state of the Ray
  container, ``missing`` or ``unreachable``), ``container_unit`` and ``vllm_unit`` (systemd's states), and
  ``procs``, what the vllm_service control script's ``procs`` printed: ``orphans`` (vLLM processes in the
  container outside the service) and ``gpu`` (``checked``, ``why``, ``outside``: GPU memory held by
  processes outside the service) (status).
- ``gpufleet_verify``: a mapping with the fields of :class:`gpufleet.runner.report.VerifyResult` (verify): the
  completion text, the status of the request without the key, whether /metrics answered, benchmark figures.
- ``gpufleet_service_load``: what vLLM does now (status): ``source: prometheus`` with ``results``, Prometheus'
  answer to each query of :data:`gpufleet.runner.service_load.PROMQL`; or ``source: metrics`` with ``first``
  and ``second``, the needed lines of two reads of /metrics ``seconds`` apart; or nothing.
- ``gpufleet_monitoring_endpoints``: ``prometheus`` and ``grafana`` URLs and ``targets_up`` (monitoring).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from gpufleet.fleet.disagg import has_pools
from gpufleet.fleet.inventory import RawInventory, read_inventory
from gpufleet.paths import project_root
from gpufleet.problems import InventoryError
from gpufleet.runner.arguments import Facts, RunSpec, restrict_env, run_stages, runner_env, strategy_env
from gpufleet.runner.downtime import DowntimeMeter, endpoint
from gpufleet.runner.events import ProgressSink
from gpufleet.runner.fleet_lock import FleetBusyError, fleet_lock
from gpufleet.runner.head_marker import (
    MARKER_PATH,
    HeadBusyError,
    HeadMarker,
    RunHolder,
    changes_hosts,
    script_argv,
)
from gpufleet.runner.owned import OwnedProcesses, host_cleanup_command
from gpufleet.runner.report import (
    DeployReport,
    GpuHolder,
    KeptRevision,
    MissingNode,
    MonitoringEndpoints,
    NodeState,
    OrphanProcess,
    RollbackReport,
    ServiceLoad,
    StageResult,
    StatusReport,
    VerifyResult,
)
from gpufleet.runner.service_load import PROMQL, from_metrics, from_prometheus
from gpufleet.vllm_log import PlanFigures, VllmFacts

__all__ = [
    "STAGES",
    "DeployError",
    "GpuHolder",
    "MissingNode",
    "NodeState",
    "OrphanProcess",
    "ProgressSink",
    "deploy",
    "deploy_specs",
    "rollback",
    "select_stages",
    "status",
    "teardown",
]

STAGES = ("preflight", "nodes", "artifacts", "cluster", "serve", "verify", "monitoring")
# A failure in these stages (the health gate: serve waits for the model to be listed, verify asks for a
# completion) makes deploy() restore the last healthy revision (playbooks/rollback.yml).
ROLLBACK_AFTER = frozenset({"cluster", "serve", "verify"})


class DeployError(Exception):
    """A run that cannot start (a missing inventory, bundle or playbook, an unknown stage): one line."""


def deploy(
    inventory: Path,
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
) -> DeployReport:
    """Run the stages (all by default, always in :data:`STAGES` order) and report.

    A change to a serving fleet is measured (the endpoint polled from here: ``report.downtime``) and gated:
    when a stage of :data:`ROLLBACK_AFTER` fails and ``rollback`` is true, every node's last healthy revision
    is restored and has to pass the gate again (``report.rollback``); the report stays not ok.

    Raises DeployError for arguments that cannot work and gpufleet.problems.InventoryError (one line per
    problem) when ``validate_inventory`` finds the inventory invalid; nothing has run on a host then.
    """
    specs = deploy_specs(
        inventory,
        bundle=bundle,
        stages=stages,
        extra_vars=extra_vars,
        check=check,
        limit=limit,
        project_dir=project_dir,
        timeout=timeout,
        env_passthrough=env_passthrough,
    )
    if validate_inventory:
        _validate(inventory)
    started = time.monotonic()
    gated = not check and any(spec.stage in ROLLBACK_AFTER for spec in specs)
    restored: RollbackReport | None = None
    with (
        _one_run(inventory, "check" if check else "deploy"),
        _downtime_meter(inventory if gated else None) as meter,
    ):
        marker = _head_marker(specs, "check" if check else "deploy")
        warnings = _acquire(marker)
        results, facts = _run(specs, progress, cancel, marker)
        failed = next((result.name for result in results if result.status != "ok"), None)
        if rollback and gated and failed in ROLLBACK_AFTER and results[-1].status == "failed":
            restored = _rollback(specs[0], "current", progress, cancel, marker, required=False)
    report = DeployReport(
        ok=failed is None,
        check_mode=check,
        seconds=round(time.monotonic() - started, 3),
        stages=tuple(results),
        failed_stage=failed,
        endpoint=_text(facts, "gpufleet_endpoint"),
        served_model=_served_model(facts),
        vllm=_vllm_facts(facts),
        verify=_verify(facts),
        warnings=tuple(warnings),
        monitoring=_monitoring(facts),
        downtime=meter.result() if meter is not None else None,
        rollback=restored,
    )
    return report.compared_with(plan) if plan is not None else report


def rollback(
    inventory: Path,
    *,
    to: Literal["current", "previous"] = "previous",
    progress: ProgressSink | None = None,
    project_dir: Path | None = None,
    timeout: int | None = None,
    cancel: Callable[[], bool] | None = None,
) -> DeployReport:
    """Restore every node's ``previous`` revision (or ``current``: the last healthy one, after a change that
    failed outside deploy()), restart what changed and pass the health gate again (playbooks/rollback.yml)."""
    spec = _spec(
        "rollback",
        inventory=_inventory(inventory),
        extravars={},
        project_dir=project_dir,
        timeout=timeout,
    )
    started = time.monotonic()
    with _one_run(inventory, "rollback"), _downtime_meter(spec.inventory) as meter:
        marker = _head_marker([spec], "rollback")
        warnings = _acquire(marker)
        restored = _rollback(spec, to, progress, cancel, marker, required=True, acquired=True)
    stage = restored.stage or StageResult(name="rollback", status="failed", seconds=0.0)
    return DeployReport(
        ok=restored.ok,
        seconds=round(time.monotonic() - started, 3),
        stages=(stage,),
        failed_stage=None if restored.ok else "rollback",
        warnings=tuple(warnings),
        downtime=meter.result() if meter is not None else None,
        rollback=restored,
    )


@contextlib.contextmanager
def _downtime_meter(inventory: Path | None) -> Iterator[DowntimeMeter | None]:
    """Polls the service's endpoint (as the inventory sets it) while the block runs; None: not measured."""
    if inventory is None:
        yield None
        return
    try:
        raw: RawInventory | None = read_inventory(inventory)
    except InventoryError:
        raw = None
    target = endpoint(raw, inventory)
    if target is None:
        yield None
        return
    with DowntimeMeter(*target) as meter:
        yield meter


def _rollback(
    template: RunSpec,
    slot: Literal["current", "previous"],
    progress: ProgressSink | None,
    cancel: Callable[[], bool] | None,
    marker: HeadMarker | None,
    *,
    required: bool,
    acquired: bool = False,
) -> RollbackReport:
    """Run playbooks/rollback.yml for ``slot`` and read what it published (``gpufleet_rollback``)."""
    try:
        spec = _spec(
            "rollback",
            inventory=template.inventory,
            # Not the failed run's -e values: the restored revision brings its own settings.
            extravars={"gpufleet_revision_slot": slot, "gpufleet_revision_required": required},
            project_dir=template.project,
            timeout=template.timeout,
            env_passthrough=template.env_passthrough,
        )
    except DeployError as missing:  # a project without the playbook (a custom project_dir)
        if required:
            raise
        return RollbackReport(slot=slot, ok=False, skipped=str(missing))
    if not acquired:
        try:  # the run's marker was released with its stages; the rollback holds it again
            _acquire(marker)
        except DeployError as busy:
            return RollbackReport(slot=slot, ok=False, skipped=str(busy))
    results, facts = _run([spec], progress, cancel, marker)
    stage = results[0] if results else None
    published = _mapping(facts, "gpufleet_rollback")
    if published is None:
        done = stage is not None and stage.status == "ok"
        why = f"no {slot} revision kept yet (no deploy of this fleet has passed its health gate)"
        return RollbackReport(slot=slot, ok=False, skipped=why if done else None, stage=stage)
    try:
        revision = KeptRevision.model_validate(published.get("revision") or {})
    except ValidationError:
        revision = None
    restored = published.get("restored") or {}
    return RollbackReport(
        slot=slot,
        ok=stage is not None and stage.status == "ok",
        revision=revision,
        restarted=_truthy(published.get("restarted")),
        restored={str(host): tuple(str(line) for line in lines or ()) for host, lines in restored.items()},
        stage=stage,
    )


def _monitoring(facts: Facts) -> MonitoringEndpoints | None:
    published = _mapping(facts, "gpufleet_monitoring_endpoints") or {}
    try:
        return MonitoringEndpoints.model_validate(
            {key: value for key, value in published.items() if value not in ("", None)}
        )
    except ValidationError:
        return None


def deploy_specs(
    inventory: Path,
    *,
    bundle: Path | None = None,
    stages: Sequence[str] | None = None,
    extra_vars: Mapping[str, Any] | None = None,
    check: bool = False,
    limit: str | None = None,
    project_dir: Path | None = None,
    timeout: int | None = None,
    env_passthrough: Sequence[str] = (),
) -> list[RunSpec]:
    """The checked playbook runs of a deploy, in order; DeployError says what cannot work and the fix."""
    inventory = _inventory(inventory)
    names = select_stages(stages)
    try:
        raw: RawInventory | None = read_inventory(inventory)
    except InventoryError:
        raw = None  # validation and the stages' playbooks report what is wrong with it
    if raw is not None and has_pools(raw):  # P/D pools: serve_pd.yml serves and checks the endpoint
        names = ["serve_pd" if name == "serve" else name for name in names if name != "verify"]
    variables = dict(extra_vars or {})
    if stages is None and not _monitoring_on(raw, variables):  # optional: no run when it is off
        names = [name for name in names if name != "monitoring"]
    if bundle is not None:
        variables["gpufleet_bundle_dir"] = str(_check_bundle(bundle, variables))
    return [
        _spec(
            name,
            inventory=inventory,
            extravars=variables,
            project_dir=project_dir,
            check=check,
            limit=limit,
            timeout=timeout,
            env_passthrough=env_passthrough,
        )
        for name in names
    ]


def _monitoring_on(raw: RawInventory | None, variables: Mapping[str, Any]) -> bool:
    """Whether gpufleet_monitoring is true for a host (or in the extra variables): the optional stage runs.
    An unreadable inventory (None) leaves the decision to the stage's own playbook."""
    if "gpufleet_monitoring" in variables:
        return _truthy(variables["gpufleet_monitoring"])
    if raw is None:
        return True
    return any(_truthy(host.variables.get("gpufleet_monitoring", False)) for host in raw.hosts)


def _truthy(value: object) -> bool:
    """Ansible's | bool for the values an inventory gives."""
    return str(value).strip().lower() in {"true", "yes", "on", "1", "y"}


def teardown(
    inventory: Path,
    *,
    limit: str | None = None,
    extra_vars: Mapping[str, Any] | None = None,
    progress: ProgressSink | None = None,
    project_dir: Path | None = None,
    timeout: int | None = None,
    cancel: Callable[[], bool] | None = None,
) -> DeployReport:
    """Stop the services (``playbooks/teardown.yml``); images, models and packages stay."""
    spec = _spec(
        "teardown",
        inventory=_inventory(inventory),
        extravars=dict(extra_vars or {}),
        project_dir=project_dir,
        limit=limit,
        timeout=timeout,
    )
    started = time.monotonic()
    with _one_run(inventory, "teardown"):
        marker = _head_marker([spec], "teardown")
        warnings = _acquire(marker)
        results, _ = _run([spec], progress, cancel, marker)
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
    """Ray and vLLM as they run now (``playbooks/status.yml``, read-only)."""
    spec = _spec(
        "status",
        inventory=_inventory(inventory),
        extravars={"gpufleet_status_promql": PROMQL},
        project_dir=project_dir,
        limit=limit,
        timeout=timeout,
    )
    results, facts = _run([spec], progress, cancel)
    alive, expected = (
        _number(facts, "gpufleet_ray_nodes_alive"),
        _number(facts, "gpufleet_ray_nodes_expected"),
    )
    ready = _flag(facts, "gpufleet_vllm_ready")
    missing = _missing_nodes(facts)
    nodes = _node_states(facts)
    ok = results[0].status == "ok" and ready and (alive is None or expected is None or alive >= expected)
    report = StatusReport(
        ok=ok,
        ray_nodes_alive=None if alive is None else int(alive),
        ray_nodes_expected=None if expected is None else int(expected),
        ray_gpus=_number(facts, "gpufleet_ray_gpus"),
        vllm_ready=ready,
        endpoint=_text(facts, "gpufleet_endpoint"),
        served_model=_served_model(facts),
        vllm=_vllm_facts(facts),
        stage=results[0],
        ray_nodes_missing=missing,
        nodes=nodes,
        vllm_facts_stale=not ready and _vllm_facts(facts) is not None,
        load=_service_load(facts) if ready else None,
    )
    # Missing Ray nodes, a node's problems, nodes that run different images or model commits (version
    # skew): every line of report.problems makes the service not healthy.
    return report.model_copy(update={"ok": False}) if report.ok and report.problems else report


def _missing_nodes(facts: Facts) -> tuple[MissingNode, ...]:
    value = facts.get("gpufleet_ray_nodes_missing", (None, None))[1]
    entries = value if isinstance(value, list) else []
    return tuple(
        MissingNode(host=str(e.get("host")), why=str(e.get("why") or "not reported by Ray"))
        for e in entries
        if isinstance(e, Mapping) and e.get("host")
    )


def _service_load(facts: Facts) -> ServiceLoad | None:
    published = _mapping(facts, "gpufleet_service_load") or {}
    if published.get("source") == "prometheus" and isinstance(published.get("results"), Mapping):
        return from_prometheus(published["results"])
    if published.get("source") == "metrics":
        first, second = published.get("first"), published.get("second")
        if isinstance(first, list) and isinstance(second, list) and second:
            return from_metrics(map(str, first), map(str, second), float(published.get("seconds") or 5))
    return None


def _node_states(facts: Facts) -> tuple[NodeState, ...]:
    nodes = _mapping(facts, "gpufleet_nodes") or {}
    states = []
    for host, published in sorted(nodes.items()):
        state: Mapping[str, Any] = published if isinstance(published, Mapping) else {}
        procs: Mapping[str, Any] = state["procs"] if isinstance(state.get("procs"), Mapping) else {}
        gpu: Mapping[str, Any] = procs["gpu"] if isinstance(procs.get("gpu"), Mapping) else {}
        try:
            states.append(
                NodeState(
                    host=str(host),
                    container=str(state.get("container") or "unknown"),
                    container_unit=str(state.get("container_unit") or "unknown"),
                    vllm_unit=str(state.get("vllm_unit") or "unknown"),
                    orphans=tuple(OrphanProcess.model_validate(o) for o in procs.get("orphans") or ()),
                    gpu_checked=bool(gpu.get("checked", False)),
                    gpu_note=str(gpu.get("why") or ""),
                    gpu_outside=tuple(GpuHolder.model_validate(g) for g in gpu.get("outside") or ()),
                    procs_error=str(procs["error"]) if procs.get("error") else None,
                    image_id=str(state.get("image_id") or "") or None,
                    model_revision=str(state.get("model_revision") or "") or None,
                    config_sha256=str(state.get("config_sha256") or "") or None,
                )
            )
        except ValidationError as error:
            states.append(NodeState(host=str(host), procs_error=f"unreadable report: {error}"[:300]))
    return tuple(states)


def select_stages(stages: Sequence[str] | None) -> list[str]:
    """The stages to run, in pipeline order; DeployError names an unknown one."""
    if stages is None:
        return list(STAGES)
    wanted = [name.strip() for name in stages if name.strip()]
    for name in wanted:
        if name not in STAGES:
            raise DeployError(
                f"stage {name!r}: unknown; expected one or more of {', '.join(STAGES)}. "
                "Fix: name stages from that list, comma-separated (e.g. --stages cluster,serve)"
            )
    if not wanted:
        raise DeployError("stages: none given. Fix: name at least one of " + ", ".join(STAGES))
    return [name for name in STAGES if name in wanted]


def _spec(
    stage: str,
    *,
    inventory: Path,
    extravars: Mapping[str, Any],
    project_dir: Path | None,
    check: bool = False,
    limit: str | None = None,
    timeout: int | None = None,
    env_passthrough: Sequence[str] = (),
) -> RunSpec:
    project = _project(project_dir)
    try:
        strategy_env(os.environ)
    except ValueError as error:
        raise DeployError(str(error)) from None
    playbook = project / "playbooks" / f"{stage}.yml"
    if not playbook.is_file():
        raise DeployError(
            f"playbook {playbook}: missing, so stage {stage!r} cannot run. "
            f"Fix: restore it from the gpufleet checkout, or leave {stage!r} out"
        )
    return RunSpec(
        stage=stage,
        project=project,
        playbook=playbook,
        inventory=inventory,
        extravars=extravars,
        check=check,
        limit=limit,
        timeout=timeout,
        env_passthrough=tuple(env_passthrough),
    )


def _head_marker(specs: Sequence[RunSpec], action: str) -> HeadMarker | None:
    """The run's marker on the head (:mod:`gpufleet.runner.head_marker`) when the run changes hosts."""
    if not specs or not changes_hosts([spec.stage for spec in specs], specs[0].check):
        return None
    holder = RunHolder.this_run(action, str(specs[0].inventory))
    return HeadMarker(lambda arguments: _on_head(specs[0], arguments), holder)


def _acquire(marker: HeadMarker | None) -> list[str]:
    """Write the head's marker before the first stage; DeployError (nothing ran) when another run holds it."""
    if marker is None:
        return []
    try:
        return marker.acquire()
    except HeadBusyError as busy:
        raise DeployError(str(busy)) from None
    except (
        _HeadUnreachableError
    ) as error:  # the stages will report the head; the control node's lock still holds
        return [f"run marker not written on the head: {error}"]


class _HeadUnreachableError(Exception):
    """The head did not run the marker script (unreachable, no python3, no sudo)."""


def _raw_on_hosts(
    spec: RunSpec,
    pattern: str,
    command: str,
    *,
    timeout: int,
    become: bool = False,
    event_handler: Callable[[Mapping[str, Any]], bool] | None = None,
) -> None:
    """An ad-hoc ``raw`` command on the hosts ``pattern`` names, with the stages' environment; the ssh
    ControlPersist masters it starts end with it (:class:`OwnedProcesses`)."""
    import ansible_runner  # noqa: PLC0415  (heavy; only for the head marker and the cleanup after a cancel)

    with tempfile.TemporaryDirectory(prefix="gpufleet-adhoc-") as private:
        # One raw command: Ansible's own strategy (mitogen's would first start a Python on every host).
        envvars = runner_env(spec, os.environ) | {"ANSIBLE_STRATEGY": "linear"}
        runner = ansible_runner.interface.init_runner(
            private_data_dir=private,
            project_dir=str(spec.project),
            inventory=str(spec.inventory),
            host_pattern=pattern,
            module="ansible.builtin.raw",
            module_args=command,
            cmdline="--become" if become else None,
            envvars=envvars,
            quiet=True,
            timeout=timeout,
            event_handler=event_handler,
            settings={"suppress_ansible_output": True, "suppress_output_file": True, "pexpect_timeout": 1},
        )
        runner.config.env = restrict_env(runner.config.env, os.environ, set(envvars))
        with OwnedProcesses():
            runner.run()


def _on_head(spec: RunSpec, arguments: list[str]) -> str:
    """Run the marker script on the head (the first host of ray_head) as root; its stdout."""
    said: list[str] = []
    matched: list[str] = []

    def handler(event: Mapping[str, Any]) -> bool:
        data = event.get("event_data") or {}
        kind = str(event.get("event", ""))
        if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
            matched.append(kind)
            res = data.get("res") or {}
            said.append(
                str(res.get("stdout") or "") + str(res.get("msg") or "") + str(res.get("stderr") or "")
            )
        return False

    _raw_on_hosts(spec, "ray_head[0]", script_argv(arguments), timeout=60, become=True, event_handler=handler)
    if not matched:
        return '{"taken": true}'  # no ray_head in the inventory: no head to mark
    if matched[-1] != "runner_on_ok":
        raise _HeadUnreachableError(" ".join(said).strip()[-300:] or matched[-1])
    return "\n".join(said)


@contextlib.contextmanager
def _one_run(inventory: Path, action: str) -> Iterator[None]:
    """The fleet's lock (:mod:`gpufleet.runner.fleet_lock`); a held lock is a DeployError."""
    try:
        with fleet_lock(inventory, action):
            yield
    except FleetBusyError as busy:
        raise DeployError(str(busy)) from None


def _inventory(inventory: Path) -> Path:
    if not inventory.exists():
        raise DeployError(
            f"inventory {inventory}: no such file or directory. "
            "Fix: pass -i with your inventory file or directory (e.g. -i inventories/prod)"
        )
    return inventory.resolve()


def _project(project_dir: Path | None) -> Path:
    if project_dir is not None:
        if not (project_dir / "playbooks").is_dir():
            raise DeployError(
                f"project {project_dir}: no playbooks/ directory. "
                "Fix: point it at a gpufleet checkout (the directory with site.yml)"
            )
        return project_dir.resolve()
    root = project_root()
    if root is None:
        raise DeployError(
            "gpufleet's playbooks: not found (no site.yml and roles/ beside this package, "
            "nor in $GPUFLEET_HOME). Fix: set GPUFLEET_HOME to the gpufleet checkout"
        )
    return root


def _check_bundle(bundle: Path, variables: Mapping[str, Any]) -> Path:
    if "gpufleet_bundle_dir" in variables:
        raise DeployError(
            "gpufleet_bundle_dir: given both as --bundle and as an extra variable. "
            "Fix: give the bundle once, with --bundle"
        )
    if not bundle.is_dir():
        raise DeployError(
            f"bundle {bundle}: not a directory. "
            "Fix: pass --bundle the directory `gpufleet bundle build` wrote"
        )
    if not (bundle / "bundle.lock.yml").is_file():
        raise DeployError(
            f"bundle {bundle}: no bundle.lock.yml in it, so it is not a gpufleet bundle. "
            "Fix: build one with `gpufleet bundle build`, or pass the directory it wrote"
        )
    return bundle.resolve()


def _validate(inventory: Path) -> None:
    """The same checks as ``gpufleet validate``; raises InventoryError."""
    try:
        from gpufleet.fleet import load_fleet  # noqa: PLC0415  (imports ansible: only when deploying)
    except ImportError:  # the inventory module is optional in a partial install; preflight checks again
        return
    load_fleet(inventory)


def _vllm_facts(facts: Facts) -> VllmFacts | None:
    published = _mapping(facts, "gpufleet_vllm_facts")
    if published is None:
        return None
    try:
        return VllmFacts.model_validate({k: v for k, v in published.items() if k in VllmFacts.model_fields})
    except ValidationError:
        return None


def _verify(facts: Facts) -> VerifyResult | None:
    published = _mapping(facts, "gpufleet_verify")
    if published is None:
        return None
    try:
        return VerifyResult.model_validate(
            {k: v for k, v in published.items() if k in VerifyResult.model_fields and v is not None}
        )
    except ValidationError:
        return None


def _served_model(facts: Facts) -> str | None:
    name = (_mapping(facts, "gpufleet_vllm_facts") or {}).get("served_model_name")
    return None if name is None else str(name)


def _mapping(facts: Facts, name: str) -> Mapping[str, Any] | None:
    value = facts.get(name, (None, None))[1]
    return value if isinstance(value, Mapping) else None


def _text(facts: Facts, name: str) -> str | None:
    value = facts.get(name, (None, None))[1]
    return None if value is None else str(value)


def _number(facts: Facts, name: str) -> float | None:
    try:
        return float(facts[name][1])
    except (KeyError, TypeError, ValueError):
        return None


def _flag(facts: Facts, name: str) -> bool:
    return _truthy(facts.get(name, (None, False))[1])


# ----- a run owns its processes (gpufleet.runner.owned) ----------------------------------------------------
def _run(
    specs: Sequence[RunSpec],
    progress: ProgressSink | None,
    cancel: Callable[[], bool] | None,
    marker: HeadMarker | None = None,
) -> tuple[list[StageResult], Facts]:
    """run_stages, owning the processes the run starts: none outlives it here, nor (canceled) on the hosts.

    The head's marker (when ``marker`` holds one) is removed at the end: by the host cleanup after a cancel
    (one round trip within CANCEL_SECONDS), else on its own."""
    started = time.time()
    run_id = marker.holder.run_id if marker is not None and marker.written else ""
    canceled = False
    try:
        with OwnedProcesses() as owned:
            results, facts = run_stages(specs, progress, cancel)
        canceled = bool(results) and results[-1].status == "canceled"
        if canceled and specs:
            _clean_hosts(specs[-1], started, owned.deadline(), run_id)
    finally:
        if run_id and marker is not None and not canceled:
            with contextlib.suppress(Exception):  # best effort: a marker left is stale once the run is gone
                marker.release()
    return results, facts


def _clean_hosts(spec: RunSpec, started: float, deadline: float, run_id: str = "") -> None:
    """After a cancel: on every host of the run, kill what the run left (gpufleet.runner.host_cleanup), before
    deadline."""
    seconds = int(deadline - time.monotonic())
    if seconds < 2:
        return
    with contextlib.suppress(Exception):  # best effort: the report says canceled either way
        _raw_on_hosts(
            spec,
            f"{spec.limit}:ray_head[0]" if spec.limit else "all:!localhost",
            host_cleanup_command(started, run_id, MARKER_PATH),
            timeout=seconds,
        )
