"""A run owns its processes (issue 13 item 3): on SIGINT the run's processes on this machine stop, an
orphan that called setsid() included, and the exit status of the run's own child stays its waiter's (the
watcher must never reap ansible-runner's ansible-playbook: ptyprocess then raised out of runner.run())."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.runner import owned

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreaper and /proc: Linux")

ORPHAN = (  # its sleep calls setsid() and is orphaned at once, as ansible-core's workers and ssh masters are
    "import subprocess; print(subprocess.Popen(['sleep', '60'], start_new_session=True,"
    " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
    except (FileNotFoundError, IndexError):
        return True


def test_sigint_stops_the_runs_processes_and_keeps_our_childs_exit_status() -> None:
    previous = signal.signal(signal.SIGINT, lambda *_: None)  # as arguments._interruptible installs one
    try:
        with owned.OwnedProcesses():
            child = subprocess.Popen(["sleep", "60"])  # stands for ansible-playbook, waited for by pexpect
            orphan = int(
                subprocess.run(
                    [sys.executable, "-c", ORPHAN], capture_output=True, text=True, check=True
                ).stdout
            )
            signalled = time.monotonic()
            os.kill(os.getpid(), signal.SIGINT)
            # pexpect polls its child now and then (WNOHANG), as here: between two polls the child is a
            # zombie, and a watcher that reaps would take its exit status
            while not gone(child.pid) and time.monotonic() < signalled + 5:
                time.sleep(0.05)
            took = time.monotonic() - signalled
            time.sleep(0.5)
            status = child.wait(timeout=10)
            assert status == -signal.SIGTERM  # 0 when the watcher stole the exit status
            assert took < 3.0
            ended = time.monotonic() + 3
            while not gone(orphan) and time.monotonic() < ended:
                time.sleep(0.05)
            assert gone(orphan), f"the setsid orphan {orphan} outlived the cancel"
        assert not Path(f"/proc/{orphan}").exists()  # reaped at the end, no zombie left
    finally:
        signal.signal(signal.SIGINT, previous)
