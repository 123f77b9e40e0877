"""One run at a time per fleet: an exclusive lock on the control node, keyed by the inventory.

Two deploys of one inventory would interleave (one deleting the image archive the other is about to load).
The lock is an ``flock`` on a file under ``$XDG_STATE_HOME/gpufleet/locks`` (``~/.local/state``) named by
the inventory's resolved path; the file also says who holds it. The kernel releases an ``flock`` when its
holder dies, however it dies, so a lock is never stale: a lock file left by a crashed run is taken over,
and its old holder line is reported only while a live process holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path


class FleetBusyError(Exception):
    """Another gpufleet run holds this fleet; the message names it and the fix."""


def lock_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpufleet" / "locks"


def lock_path(inventory: Path) -> Path:
    key = hashlib.sha256(str(inventory.resolve()).encode()).hexdigest()[:16]
    return lock_dir() / f"{key}.lock"


@contextlib.contextmanager
def fleet_lock(inventory: Path, action: str) -> Iterator[None]:
    """Hold the fleet's lock for the block; FleetBusyError at once when another live run holds it."""
    path = lock_path(inventory)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise FleetBusyError(_busy_message(inventory, handle.read(), path)) from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(_holder(inventory, action)) + "\n")
            handle.flush()
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


def _holder(inventory: Path, action: str) -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "action": action,
        "command": " ".join(sys.argv),
        "inventory": str(inventory.resolve()),
    }


def _busy_message(inventory: Path, text: str, path: Path) -> str:
    try:
        holder = json.loads(text)
        who = f"pid {holder['pid']} ({holder['user']}@{holder['host']}, {holder['action']})"
        who += f" since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        who = "another process (its details are not written yet)"
    return (
        f"inventory {inventory}: another gpufleet run holds this fleet: {who}. Fix: wait for it to finish, "
        f"or stop it (the lock, {path}, goes with its process)"
    )
