"""What a run does, in order: a :class:`RunPlan` of :class:`Step` (playbook, extra variables, limit).

A deploy's plan is its stages (:data:`STAGES` order), chosen by :func:`deploy_plan` from what was asked and
from the fleet as :func:`gpufleet.fleet.load` read it (once per run); status, teardown and rollback each run
one :class:`Step`.
With the run's :class:`~gpufleet.runner.options.RunOptions` a plan becomes the checked playbook runs
(:class:`~gpufleet.runner.arguments.RunSpec`) that :func:`gpufleet.runner.arguments.run_stages` runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.fleet.loaded import load
from gpufleet.fleet.raw import RawInventory
from gpufleet.runner.arguments import RunSpec
from gpufleet.runner.facts import as_bool
from gpufleet.runner.options import DeployError, RunOptions, checked_bundle, checked_inventory

STAGES = ("preflight", "nodes", "artifacts", "cluster", "serve", "verify", "monitoring")
# A failure in these stages (the health gate: serve waits for the model to be listed, verify asks for a
# completion) makes deploy() restore the last healthy revision (playbooks/rollback.yml).
ROLLBACK_AFTER = frozenset({"cluster", "serve", "verify"})


@dataclass(frozen=True)
class Step:
    """One playbook run: ``playbooks/<stage>.yml`` with its extra variables, on the hosts ``limit`` names."""

    stage: str
    extravars: Mapping[str, Any] = field(default_factory=dict)
    limit: str | None = None


@dataclass(frozen=True)
class RunPlan:
    """The steps of a run, in the order they run; a failed step stops the run."""

    steps: tuple[Step, ...]

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(step.stage for step in self.steps)

    def specs(self, options: RunOptions) -> list[RunSpec]:
        """The checked playbook runs; DeployError names a missing playbook."""
        return [spec(step, options) for step in self.steps]


def spec(step: Step, options: RunOptions) -> RunSpec:
    playbook = options.project / "playbooks" / f"{step.stage}.yml"
    if not playbook.is_file():
        raise DeployError(
            f"playbook {playbook}: missing, so stage {step.stage!r} cannot run. "
            f"Fix: restore it from the gpufleet checkout, or leave {step.stage!r} out"
        )
    return RunSpec(
        stage=step.stage,
        project=options.project,
        playbook=playbook,
        inventory=options.inventory,
        extravars=step.extravars,
        check=options.check,
        limit=step.limit,
        timeout=options.timeout,
        env_passthrough=options.env_passthrough,
    )


def deploy_plan(
    raw: RawInventory | None,
    *,
    stages: Sequence[str] | None = None,
    extra_vars: Mapping[str, Any] | None = None,
    bundle: Path | None = None,
    limit: str | None = None,
) -> RunPlan:
    """A deploy's stages as a plan; DeployError for an unknown stage or a bundle that is not one."""
    names = select_stages(stages)
    variables = dict(extra_vars or {})
    if stages is None and not monitoring_on(raw, variables):  # optional: no run when it is off
        names = [name for name in names if name != "monitoring"]
    if bundle is not None:
        variables["gpufleet_bundle_dir"] = str(checked_bundle(bundle, variables))
    return RunPlan(tuple(Step(name, variables, limit) for name in names))


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
    inventory = checked_inventory(inventory)
    raw = load(inventory, validate=False).raw
    plan = deploy_plan(raw, stages=stages, extra_vars=extra_vars, bundle=bundle, limit=limit)
    options = RunOptions.checked(
        inventory, project_dir=project_dir, check=check, timeout=timeout, env_passthrough=env_passthrough
    )
    return plan.specs(options)


def monitoring_on(raw: RawInventory | None, variables: Mapping[str, Any]) -> bool:
    """Whether gpufleet_monitoring is true for a host (or in the extra variables): the optional stage runs.
    An unreadable inventory (None) leaves the decision to the stage's own playbook."""
    if "gpufleet_monitoring" in variables:
        return as_bool(variables["gpufleet_monitoring"])
    if raw is None:
        return True
    return any(as_bool(host.variables.get("gpufleet_monitoring", False)) for host in raw.hosts)


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
