"""Action plugin ``gpufleet_validate``: run gpufleet's inventory validation and planner on the controller.

Plain ``ansible-playbook site.yml`` users get exactly the checks of ``gpufleet validate``: this adapter calls
the same Python code and fails the play, before any host is changed, with one line per problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("inventory",))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        sources = self._task.args.get("inventory") or task_vars.get("ansible_inventory_sources") or []
        if isinstance(sources, str):
            sources = [sources]
        try:
            from gpufleet.fleet import validate_inventory  # noqa: PLC0415
            from gpufleet.fleet.services import not_deployable  # noqa: PLC0415
        except ImportError:
            return result | {
                "failed": True,
                "msg": "the gpufleet Python package is not importable by this ansible-playbook's Python; "
                "install it into the same environment (pip install -e . in the gpufleet checkout)",
            }
        problems: list[str] = []
        warnings: list[str] = []
        for source in sources:
            validation = validate_inventory(Path(source))
            problems += [str(problem) for problem in validation.problems]
            if validation.fleet is not None and not validation.problems:
                problems += [str(problem) for problem in not_deployable(validation.fleet)]
            warnings += validation.warnings
        for warning in warnings:
            display.warning(warning)
        result.update(changed=False, problems=problems, warnings_found=warnings, inventories=sources)
        if problems:
            result["failed"] = True
            result["msg"] = "the inventory is not valid; nothing was changed on any host:\n" + "\n".join(
                problems
            )
        else:
            result["msg"] = f"inventory valid ({', '.join(sources)})"
        return result
