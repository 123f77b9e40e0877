"""How a run goes, whatever playbooks it runs: one frozen :class:`RunOptions`, checked once.

The inventory, the project (``$GPUFLEET_HOME`` or the checkout this package runs from), check mode, the
time limit and the environment passed through are the same for every playbook of a run, the rollback that
may follow included; what differs from step to step (playbook, extra variables, limit) is a
:class:`gpufleet.runner.plan.Step`. Every check here raises :class:`DeployError`, one line with the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.paths import project_root
from gpufleet.runner.arguments import strategy_env


class DeployError(Exception):
    """A run that cannot start (a missing inventory, bundle or playbook, an unknown stage): one line."""


@dataclass(frozen=True)
class RunOptions:
    """What every playbook of one run shares (build it with :meth:`checked`)."""

    inventory: Path
    project: Path
    check: bool = False
    timeout: int | None = None
    env_passthrough: tuple[str, ...] = ()

    @classmethod
    def checked(
        cls,
        inventory: Path,
        *,
        project_dir: Path | None = None,
        check: bool = False,
        timeout: int | None = None,
        env_passthrough: Sequence[str] = (),
    ) -> RunOptions:
        """The options of a run that can start; DeployError says what cannot work and the fix."""
        inventory, project = checked_inventory(inventory), checked_project(project_dir)
        try:
            strategy_env(os.environ)
        except ValueError as error:
            raise DeployError(str(error)) from None
        return cls(inventory, project, check, timeout, tuple(env_passthrough))


def checked_inventory(inventory: Path) -> Path:
    if not inventory.exists():
        raise DeployError(
            f"inventory {inventory}: no such file or directory. "
            "Fix: pass -i with your inventory file or directory (e.g. -i inventories/prod)"
        )
    return inventory.resolve()


def checked_project(project_dir: Path | None) -> Path:
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


def checked_bundle(bundle: Path, variables: Mapping[str, Any]) -> Path:
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
