"""Runs on each host after a canceled run (``python3 - STARTED RUN_ID MARKER``, sent on stdin by
:func:`gpufleet.runner.owned.host_cleanup_command`); never imported on the control node.

Kills, whole trees: an Ansible module invocation (``/bin/sh -c '... && sleep 0'``) whose ssh session is gone
(ppid 1), and an async job this run started: Ansible's (async_wrapper) or, under mitogen's strategy (the
runner's default), a context mitogen titled ``python3(mitogen:user@controller:pid)``, which runs an async
job (the relay's receivers) in a process of its own that outlives the run's connection. STARTED is the run's
start on the control node's clock, which Ansible writes into the remote temporary directories' names; a
mitogen context is this run's when it started at STARTED or later on the host's clock. SIGTERM first,
SIGKILL after 2.5 s, done within 4.5 s. Then the head's run marker (MARKER) is removed when it is still
this run's (RUN_ID; ``-`` for none). Standard library only: the host's python3 runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time

# Annotations only (postponed): a host's python3 may be older than the control node's.

# The title mitogen gives each context it starts on a host: python3(mitogen:<user>@<control node>:<pid>).
MITOGEN_TITLE = re.compile(r"\S*python[\d.]*\(mitogen:")


def table() -> dict[int, tuple[int, list[str], float]]:
    """Every live process (zombies left out): pid -> (ppid, argv, start in seconds since the epoch)."""
    found: dict[int, tuple[int, list[str], float]] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat", encoding="ascii") as handle:
        boot = next(float(line.split()[1]) for line in handle if line.startswith("btime "))
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X"):
            since = boot + int(fields[19]) / ticks  # field 22 of stat(5): starttime, in clock ticks
            found[int(name)] = (
                int(fields[1]),
                [part.decode("utf-8", "replace") for part in argv if part],
                since,
            )
    return found


def roots(procs: dict[int, tuple[int, list[str], float]], started: float) -> set[int]:
    """The orphaned module invocations, and the async jobs of a run that started at ``started``."""
    out: set[int] = set()
    for pid, (ppid, argv, since) in procs.items():
        text = " ".join(argv)
        if ppid == 1 and argv[:2] == ["/bin/sh", "-c"] and text.endswith("&& sleep 0"):
            out.add(pid)
        stamp = re.search(r"ansible-tmp-(\d+(?:\.\d+)?)-", text)
        if ppid == 1 and "async_wrapper" in text and stamp and float(stamp.group(1)) >= started:
            out.add(pid)
        if argv and MITOGEN_TITLE.match(argv[0]) and since >= started:
            out.add(pid)
    return out


def trees(procs: dict[int, tuple[int, list[str], float]], top: set[int], me: int) -> set[int]:
    """``top`` and every descendant, less this process."""
    tree = set(top)
    while True:
        more = {pid for pid, (ppid, _, _) in procs.items() if ppid in tree} - tree
        if not more:
            return tree - {me}
        tree |= more


def kill_left(started: float, me: int) -> tuple[int, int]:
    """(processes signalled, processes still alive at the end)."""
    deadline = time.time() + 2.5
    killed: set[int] = set()
    signal_number = signal.SIGTERM
    while True:
        procs = table()
        left = trees(procs, roots(procs, started) | (killed & set(procs)), me)
        if not left or time.time() > deadline + 2:
            return len(killed), len(left)
        if time.time() > deadline:
            signal_number = signal.SIGKILL
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal_number)
        killed |= left
        time.sleep(0.2)


def release_marker(run_id: str, marker: str) -> None:
    """Remove the head's run marker when it is this run's (a later run's is left alone)."""
    if run_id == "-":
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(marker, encoding="utf-8") as handle:
            holder = json.load(handle)
        if holder.get("run_id") == run_id:
            os.unlink(marker)


def main(argv: list[str]) -> int:
    started = float(argv[1])
    killed, left = kill_left(started, os.getpid())
    if len(argv) > 3:
        release_marker(argv[2], argv[3])
    print(f"gpufleet cleanup: {killed} killed, {left} left")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
