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
- ``gpufleet_verify``: a mapping with the fields of :class:`gpufleet.runner.report.VerifyResult` (verify): the
  completion text, the status of the request without the key, whether /metrics answered, benchmark figures.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.paths import project_root
from gpufleet.runner.arguments import Facts, RunSpec, run_stages
from gpufleet.runner.events import ProgressSink
from gpufleet.runner.fleet_lock import FleetBusyError, fleet_lock
from gpufleet.runner.report import DeployReport, StatusReport, VerifyResult
from gpufleet.vllm_log import PlanFigures, VllmFacts

__all__ = [
    "STAGES",
    "DeployError",
    "ProgressSink",
    "deploy",
    "deploy_specs",
    "select_stages",
    "status",
    "teardown",
]

STAGES = ("preflight", "nodes", "artifacts", "cluster", "serve", "verify")


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
) -> DeployReport:
    """Run the stages (all by default, always in :data:`STAGES` order) and report.

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
    with _one_run(inventory, "check" if check else "deploy"):
        results, facts = run_stages(specs, progress, cancel)
    failed = next((result.name for result in results if result.status != "ok"), None)
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
    )
    return report.compared_with(plan) if plan is not None else report


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
    variables = dict(extra_vars or {})
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
        results, _ = run_stages([spec], progress, cancel)
    ok = results[0].status == "ok"
    return DeployReport(
        ok=ok,
        seconds=round(time.monotonic() - started, 3),
        stages=tuple(results),
        failed_stage=None if ok else "teardown",
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
        extravars={},
        project_dir=project_dir,
        limit=limit,
        timeout=timeout,
    )
    results, facts = run_stages([spec], progress, cancel)
    alive, expected = (
        _number(facts, "gpufleet_ray_nodes_alive"),
        _number(facts, "gpufleet_ray_nodes_expected"),
    )
    ready = _flag(facts, "gpufleet_vllm_ready")
    ok = results[0].status == "ok" and ready and (alive is None or expected is None or alive >= expected)
    return StatusReport(
        ok=ok,
        ray_nodes_alive=None if alive is None else int(alive),
        ray_nodes_expected=None if expected is None else int(expected),
        ray_gpus=_number(facts, "gpufleet_ray_gpus"),
        vllm_ready=ready,
        endpoint=_text(facts, "gpufleet_endpoint"),
        served_model=_served_model(facts),
        vllm=_vllm_facts(facts),
        stage=results[0],
    )


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
    value = facts.get(name, (None, False))[1]
    return value is True or str(value).strip().lower() in ("true", "yes", "1")
