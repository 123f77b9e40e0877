"""Action plugin ``gpufleet_converged``: the module as it is, but its fleet check without the module wrapper.

Every state but ``fleet_check`` runs the module as usual. ``fleet_check`` (playbooks/fleet_check.yml, one task
per node: the whole of a no-op re-run's per-node work) runs the copy of the module that fleet_record.yml
installed on the node (``/usr/local/libexec/gpufleet-converged --fleet-check PARAMS``) over the connection
directly: Ansible's module wrapper (unpacking and compiling its module code on the node) cost about 0.2 s of a
node's CPU per check, five times the check itself (benchmarks/results/deploy.md). Where that copy is missing
or answers anything but its JSON (a node never recorded, an older gpufleet), the module runs as usual.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ansible.plugins.action import ActionBase

SCRIPT = "/usr/local/libexec/gpufleet-converged"  # where playbooks/fleet_record.yml installs the module
SCRIPT_FLAG = "--fleet-check"  # the module's own (it cannot be imported from here)
PARAMS = ("name", "digest", "roles", "files", "trees", "units", "commands", "root")


class ActionModule(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        if args.get("state") == "fleet_check":
            answered = self._script(args, task_vars)
            if answered is not None:
                return result | answered
        ran: dict[str, Any] = self._execute_module(
            module_name="gpufleet_converged", module_args=args, task_vars=task_vars
        )
        return result | ran

    def _script(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any] | None:
        params = {key: args[key] for key in PARAMS if key in args}
        params["check_mode"] = bool(self._task.check_mode)
        python = task_vars.get("ansible_python_interpreter") or "/usr/bin/python3"
        if not isinstance(python, str) or "{" in python or not python.startswith("/"):
            python = "/usr/bin/python3"  # a template or interpreter discovery: the module path handles those
        # -S: the check needs the standard library alone (and imports less); no sudo for a root login, where
        # it would only switch root to root (its PAM session costs the node more than a tenth of the check)
        argv = (python, "-S", SCRIPT, SCRIPT_FLAG, json.dumps(params))
        command = " ".join(shlex.quote(part) for part in argv)
        ran = self._low_level_execute_command(command, sudoable=self._switches_user())
        if ran.get("rc") != 0:
            return None
        try:
            answer = json.loads(str(ran.get("stdout", "")).strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None
        return answer if isinstance(answer, dict) and "in_sync" in answer else None

    def _switches_user(self) -> bool:
        """Whether become changes the user: not for root logging in to become root."""
        if not self._connection.become:
            return False
        become_user = self.get_become_option("become_user") or "root"
        return not (self._get_remote_user() == "root" and become_user == "root")
