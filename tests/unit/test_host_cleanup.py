"""The program that cleans a host after a canceled run (gpufleet.runner.host_cleanup), as a module: which
processes it picks, which marker it removes, and the command that ships it. Its run on real hosts, after a
SIGINT mid-artifacts, is asserted by the lab's end-to-end module (nothing of the run left on any host)."""

from __future__ import annotations

import base64
import json
import os
import re
import time
from pathlib import Path, PurePosixPath

from gpufleet.runner import host_cleanup
from gpufleet.runner.owned import HOST_CLEANUP, host_cleanup_command

STARTED = 1_700_000_000.0
MODULE = "/root/.ansible/tmp/x/AnsiballZ_command.py"
LATER, EARLIER = (f"/root/.ansible/tmp/ansible-tmp-{STARTED + d:.2f}-1-2/async_wrapper.py" for d in (5, -5))
# pid -> (ppid, argv, start on the host's clock)
PROCS = {
    10: (
        1,
        ["/bin/sh", "-c", f"/usr/bin/python3 {MODULE} && sleep 0"],
        STARTED + 1,
    ),
    11: (10, ["/usr/bin/python3", MODULE], STARTED + 1),
    12: (11, ["docker", "load"], STARTED + 1),
    20: (
        1,
        ["/usr/bin/python3", LATER],
        STARTED + 5,
    ),
    21: (20, ["python3", "gpufleet_relay.py", "recv"], STARTED + 5),
    30: (
        1,
        ["/usr/bin/python3", EARLIER],
        STARTED - 5,
    ),
    40: (7, ["/bin/sh", "-c", "echo still in its session && sleep 0"], STARTED + 2),
    50: (1, ["/usr/sbin/sshd", "-D"], STARTED - 900),
    # mitogen's strategy (the runner's default): an async job is a forked context, titled, with the command
    # under it; under its fork parent while that lives, under init after. The one of an earlier run stays.
    60: (55, ["/usr/bin/python3(mitogen:root@vm:27726)"], STARTED + 3),
    61: (60, ["/usr/bin/python3", "/usr/local/libexec/gpufleet/gpufleet_relay.py", "recv"], STARTED + 3),
    62: (61, ["docker", "load"], STARTED + 4),
    70: (1, ["/usr/bin/python3(mitogen:root@vm:1234)"], STARTED - 60),
    71: (70, ["sleep", "300"], STARTED - 60),
}


def test_it_picks_orphaned_module_runs_and_this_runs_async_jobs_with_their_trees() -> None:
    top = host_cleanup.roots(PROCS, STARTED)
    # not an earlier run's job (30, 70), a task still in its session (40), or sshd
    assert top == {10, 20, 60}
    assert host_cleanup.trees(PROCS, top, me=21) == {10, 11, 12, 20, 60, 61, 62}  # never itself


def test_the_table_gives_each_process_its_start_on_the_hosts_clock() -> None:
    me = host_cleanup.table()[os.getpid()]
    assert me[1] and abs(me[2] - time.time()) < 3600  # this test process started within the hour


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
