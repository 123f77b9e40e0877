"""The program that cleans a host after a canceled run (gpufleet.runner.host_cleanup), as a module: which
processes it picks, which marker it removes, and the command that ships it. Its run on real hosts, after a
SIGINT mid-artifacts, is asserted by the lab's end-to-end module (nothing of the run left on any host)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path, PurePosixPath

from gpufleet.runner import host_cleanup
from gpufleet.runner.owned import HOST_CLEANUP, host_cleanup_command

STARTED = 1_700_000_000.0
PROCS = {
    10: (1, ["/bin/sh", "-c", "/usr/bin/python3 /root/.ansible/tmp/x/AnsiballZ_command.py && sleep 0"]),
    11: (10, ["/usr/bin/python3", "/root/.ansible/tmp/x/AnsiballZ_command.py"]),
    12: (11, ["docker", "load"]),
    20: (1, ["/usr/bin/python3", f"/root/.ansible/tmp/ansible-tmp-{STARTED + 5:.2f}-1-2/async_wrapper.py"]),
    21: (20, ["python3", "gpufleet_relay.py", "recv"]),
    30: (1, ["/usr/bin/python3", f"/root/.ansible/tmp/ansible-tmp-{STARTED - 5:.2f}-1-2/async_wrapper.py"]),
    40: (7, ["/bin/sh", "-c", "echo still in its session && sleep 0"]),
    50: (1, ["/usr/sbin/sshd", "-D"]),
}


def test_it_picks_orphaned_module_runs_and_this_runs_async_jobs_with_their_trees() -> None:
    top = host_cleanup.roots(PROCS, STARTED)
    assert top == {10, 20}  # not an earlier run's job (30), a task still in its session (40), or sshd
    assert host_cleanup.trees(PROCS, top, me=21) == {10, 11, 12, 20}  # never itself


def test_it_removes_the_marker_of_this_run_only(tmp_path: Path) -> None:
    marker = tmp_path / "run.json"
    marker.write_text(json.dumps({"run_id": "another"}), encoding="utf-8")
    host_cleanup.release_marker("mine", str(marker))
    host_cleanup.release_marker("-", str(marker))
    assert marker.exists()
    host_cleanup.release_marker("another", str(marker))
    assert not marker.exists()
    host_cleanup.release_marker("another", str(marker))  # gone already, or unreadable: no error


def test_the_command_ships_the_module_itself() -> None:
    command = host_cleanup_command(STARTED, "abc", PurePosixPath("/var/lib/gpufleet/run.json"))
    shape = r"echo (\S+) \| base64 -d \| python3 - (\S+) abc /var/lib/gpufleet/run\.json"
    match = re.fullmatch(shape, command)
    assert match, command
    assert base64.b64decode(match.group(1)) == HOST_CLEANUP.read_bytes()
    assert float(match.group(2)) == STARTED
    assert host_cleanup_command(STARTED, "", PurePosixPath("/m")).endswith(" - /m")
