"""The runner's ad-hoc commands on hosts, outside the stages' playbooks: the run marker on the control host
(:mod:`gpufleet.runner.head_marker`; :mod:`gpufleet.fleet.control`: group gpufleet_control's host, else the
Ray head) and the host cleanup after a cancel (:mod:`gpufleet.runner.host_cleanup`).

Each is one ``raw`` command through ansible-runner, with the stages' inventory, project and environment.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpufleet.runner.arguments import RunSpec, restrict_env, runner_env
from gpufleet.runner.head_marker import (
    MARKER_PATH,
    HeadBusyError,
    HeadMarker,
    RunHolder,
    changes_hosts,
    script_argv,
)
from gpufleet.runner.options import DeployError
from gpufleet.runner.owned import OwnedProcesses, host_cleanup_command

HEAD = "ray_head[0]"  # the control host when the caller names none (an inventory without gpufleet_control)
MARKER_SECONDS = 60  # the marker script's time limit on the control host


class HeadUnreachableError(Exception):
    """The head did not run the marker script (unreachable, no python3, no sudo)."""


def head_marker(specs: Sequence[RunSpec], action: str, control: str | None = None) -> HeadMarker | None:
    """The run's marker on the control host ``control`` (None: the Ray head) when the run changes hosts."""
    if not specs or not changes_hosts([spec.stage for spec in specs], specs[0].check):
        return None
    holder = RunHolder.this_run(action, str(specs[0].inventory))
    return HeadMarker(lambda arguments: on_head(specs[0], arguments, control), holder)


def acquire(marker: HeadMarker | None) -> list[str]:
    """Write the head's marker before the first stage; DeployError (nothing ran) when another run holds it."""
    if marker is None:
        return []
    try:
        return marker.acquire()
    except HeadBusyError as busy:
        raise DeployError(str(busy)) from None
    except HeadUnreachableError as error:  # the stages will report the head; the control node's lock holds
        return [f"run marker not written on the head: {error}"]


def on_head(spec: RunSpec, arguments: list[str], control: str | None = None) -> str:
    """Run the marker script on the control host (``control``; None: the first host of ray_head) as root;
    its stdout."""
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

    raw_on_hosts(
        spec,
        control or HEAD,
        script_argv(arguments),
        timeout=MARKER_SECONDS,
        become=True,
        event_handler=handler,
    )
    if not matched:
        return '{"taken": true}'  # no control host in the inventory: nothing to mark
    if matched[-1] != "runner_on_ok":
        raise HeadUnreachableError(" ".join(said).strip()[-300:] or matched[-1])
    return "\n".join(said)


def clean_hosts(
    spec: RunSpec, started: float, deadline: float, run_id: str = "", control: str | None = None
) -> None:
    """After a cancel: on every host of the run and the control host (``control``; None: the Ray head), kill
    what the run left (gpufleet.runner.host_cleanup) and release its marker, before deadline."""
    seconds = int(deadline - time.monotonic())
    if seconds < 2:
        return
    with contextlib.suppress(Exception):  # best effort: the report says canceled either way
        raw_on_hosts(
            spec,
            f"{spec.limit}:{control or HEAD}" if spec.limit else "all:!localhost",
            host_cleanup_command(started, run_id, MARKER_PATH),
            timeout=seconds,
        )


def raw_on_hosts(
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
