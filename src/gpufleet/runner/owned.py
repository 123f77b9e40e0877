"""A run owns its processes.

ansible-runner stops a canceled playbook by SIGKILL to ansible-playbook's process group, but ansible-core's
workers call setsid() and their ssh clients (and ControlPersist masters, which daemonize) live on, and on
the hosts a task's processes (docker load, the relay) do not die with their ssh session. So for the length
of a run gpufleet is a child subreaper (orphaned descendants are reparented to it, not to init); on SIGINT
or SIGTERM (seen through signal.set_wakeup_fd, at once) it stops every process the run started on this
machine, and after a canceled run it kills, on every host of the run, the Ansible task processes that
lost their ssh session and the async jobs (the relay) this run started. Within CANCEL_SECONDS in all.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

CANCEL_SECONDS = 10.0
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
# The program that cleans a host after a cancel: a real module of this package (linted and type-checked with
# the rest), sent to the host's python3 on stdin, never imported here.
HOST_CLEANUP = Path(__file__).with_name("host_cleanup.py")


def host_cleanup_command(started: float, run_id: str, marker: PurePosixPath) -> str:
    """The shell command that runs :mod:`gpufleet.runner.host_cleanup` on a host (base64: no quoting)."""
    script = base64.b64encode(HOST_CLEANUP.read_bytes()).decode()
    return f"echo {script} | base64 -d | python3 - {started:.3f} {run_id or '-'} {marker}"


class OwnedProcesses:
    """For a run's length: a child subreaper (Linux), and a signal watcher that stops the run's processes."""

    def __init__(self) -> None:
        self._me = os.getpid()
        self._before: set[int] = set()
        self._was_subreaper = 0
        self._signalled: float | None = None
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup = -1
        self._watcher: threading.Thread | None = None
        self._libc: Any = None

    def deadline(self) -> float:
        """When a canceled run must have stopped everything (monotonic)."""
        return (self._signalled or time.monotonic()) + CANCEL_SECONDS - 0.5

    def __enter__(self) -> OwnedProcesses:
        if not sys.platform.startswith("linux"):
            return self
        self._before = _descendants(self._me)
        with contextlib.suppress(OSError, AttributeError):
            self._libc = ctypes.CDLL(None, use_errno=True)
            flag = ctypes.c_int(0)
            self._libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
            self._was_subreaper = flag.value
            self._libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if threading.current_thread() is threading.main_thread():
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            try:
                self._previous_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            except ValueError:
                os.close(read_end)
                os.close(write_end)
            else:
                self._pipe = (read_end, write_end)
                self._watcher = threading.Thread(target=self._watch, name="gpufleet-cancel", daemon=True)
                self._watcher.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            os.write(self._pipe[1], b"\0")  # wakes the watcher, which then ends
            if self._watcher is not None:
                self._watcher.join(timeout=5)
            for fd in self._pipe:
                os.close(fd)
        if sys.platform.startswith("linux"):
            # ssh ControlPersist masters (and, after a cancel, anything left); ansible-runner has collected
            # its own child by now, so every child left is an orphan reparented to us: reap those
            self.stop(grace=2.0, reap=True)
            if self._libc is not None:
                self._libc.prctl(_PR_SET_CHILD_SUBREAPER, self._was_subreaper, 0, 0, 0)

    def _watch(self) -> None:
        assert self._pipe is not None
        while True:
            try:
                data = os.read(self._pipe[0], 64)
            except OSError:
                return
            if not data or b"\0" in data:
                return
            if {signal.SIGINT, signal.SIGTERM} & set(data):
                self._signalled = self._signalled or time.monotonic()
                self.stop(grace=2.0, reap=False)

    def stop(self, grace: float, *, reap: bool) -> None:
        """SIGTERM every process the run started here, SIGKILL what is left after ``grace`` s.

        ``reap``: also collect the exit of our children that ended. Never while ansible-runner runs: its
        child (ansible-playbook, which pexpect waits for) is our child too, and a stolen exit status makes
        ptyprocess raise ("no child process") out of runner.run(). Zombies are not counted as left."""
        ended = time.monotonic() + grace
        signal_number = signal.SIGTERM
        sent: set[int] = set()
        while True:
            left = _descendants(self._me) - self._before
            if reap:
                self._reap(left)
            left = {pid for pid in left if _alive(pid)}
            if not left:
                return
            if time.monotonic() > ended:
                if signal_number == signal.SIGKILL:
                    return
                signal_number, sent, ended = signal.SIGKILL, set(), time.monotonic() + 1.0
            for pid in left - sent:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal_number)
                sent.add(pid)
            time.sleep(0.05)

    def _reap(self, pids: set[int]) -> None:
        """Collect the exit of children that were reparented to us (never ansible-runner's own child)."""
        for pid in pids:
            if _ppid(pid) == self._me and not _alive(pid):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def _ppid(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _proc_stat(int(name))) is not None:
            children.setdefault(stat[1], []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
