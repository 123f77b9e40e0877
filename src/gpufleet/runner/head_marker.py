"""One run at a time per fleet, across control nodes: a marker on the head host.

The control node's ``flock`` (:mod:`gpufleet.runner.fleet_lock`) keeps two runs of one control node apart;
two control nodes (two operators, a laptop and a CI job) each hold their own. So a run that changes hosts
also writes ``/var/lib/gpufleet/run.json`` on the head (the first host of ``ray_head``) before its first
stage, saying which run holds the fleet (run id, ``user@host`` of the control node, pid, action, since when),
and removes it when it ends, however it ends (a canceled run removes it in the host cleanup).

A run that finds another run's marker refuses (:class:`HeadBusyError`, naming who holds it since when)
unless the marker is stale: older than the stale limit (``GPUFLEET_RUN_MARKER_STALE_HOURS``, 12 by
default; no gpufleet run takes that long), or written by this same control node by a process that is gone
(a run killed with ``kill -9``, a power cut). A stale marker is taken over with a warning.

Reading, judging and writing happen in one step on the head under an ``flock`` there (:data:`HOST_SCRIPT`),
so that two control nodes never both take the marker; times are the head's clock (no skew between control
nodes). The marker lives in the runner, not in a play of ``site.yml``: ``gpufleet deploy`` runs the stage
playbooks one by one (never site.yml), a play at the end of a playbook does not run after a failure or a
Ctrl-C, and whether a holder's pid is alive can only be judged on the control node.
"""

from __future__ import annotations

import base64
import getpass
import json
import math
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any

MARKER_PATH = PurePosixPath("/var/lib/gpufleet/run.json")
STALE_HOURS = 12.0
# Stages that only read the hosts; every other stage (and teardown) changes them and needs the marker.
# verify is not among them: it records each node's revision once the gate passed.
READ_ONLY_STAGES = frozenset({"preflight", "status"})

# Runs on the head: python3 - OP PATH ARG [TAKEOVER]. OP acquire: ARG is the new marker as JSON (base64);
# it is written when there is none, or the one there is ours or TAKEOVER's (the run id judged stale).
# OP release: ARG is a run id; the marker is removed when it is that run's. Prints one JSON line.
HOST_SCRIPT = r"""
import base64, fcntl, json, os, sys, time
op, path, arg = sys.argv[1], sys.argv[2], sys.argv[3]
takeover = sys.argv[4] if len(sys.argv) > 4 else ""
os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
with open(path + ".lock", "a") as guard:
    fcntl.flock(guard, fcntl.LOCK_EX)
    try:
        with open(path, "rb") as handle:
            current = json.loads(handle.read().decode("utf-8"))
        if not isinstance(current, dict):
            raise ValueError("not a mapping")
    except FileNotFoundError:
        current = None
    except (OSError, ValueError) as error:
        current = {"run_id": "unreadable", "unreadable": str(error), "started": os.stat(path).st_mtime}
    now = time.time()
    held_by = (current or {}).get("run_id")
    if op == "acquire":
        new = json.loads(base64.b64decode(arg).decode("utf-8"))
        if current is None or held_by in (new["run_id"], takeover):
            new["started"] = now
            with open(path + ".new", "w") as handle:
                json.dump(new, handle)
                handle.write("\n")
            os.chmod(path + ".new", 0o644)
            os.replace(path + ".new", path)
            print(json.dumps({"taken": True, "previous": current, "now": now}))
        else:
            print(json.dumps({"taken": False, "current": current, "now": now}))
    elif op == "release":
        if held_by == arg:
            os.unlink(path)
        print(json.dumps({"released": held_by == arg, "current": current, "now": now}))
"""


class HeadBusyError(Exception):
    """Another run (of another control node, or a live one of this) holds the fleet's head marker."""


@dataclass(frozen=True)
class RunHolder:
    """What the marker says about the run that holds the fleet."""

    run_id: str
    control: str  # user@host of the control node
    pid: int
    action: str
    inventory: str = ""
    command: str = ""
    started: float = 0.0  # the head's clock, set when written

    @classmethod
    def this_run(cls, action: str, inventory: str) -> RunHolder:
        return cls(
            run_id=uuid.uuid4().hex,
            control=control_node(),
            pid=os.getpid(),
            action=action,
            inventory=inventory,
            command=" ".join(sys.argv)[:300],
        )

    @classmethod
    def read(cls, published: Mapping[str, Any]) -> RunHolder:
        """From a marker as found on the head (tolerant: an old or hand-made one lacks fields)."""

        def number(name: str) -> float:
            try:
                return float(published.get(name) or 0)
            except (TypeError, ValueError):
                return 0.0

        return cls(
            run_id=str(published.get("run_id") or "unknown"),
            control=str(published.get("control") or "an unknown control node"),
            pid=int(number("pid")),
            action=str(published.get("action") or "a run"),
            inventory=str(published.get("inventory") or ""),
            command=str(published.get("command") or ""),
            started=number("started"),
        )

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started)) if self.started else "?"
        return f"{self.action} run {self.run_id[:12]} of {self.control} (pid {self.pid}) since {since}"


def control_node() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def changes_hosts(stages: Sequence[str], check: bool = False) -> bool:
    """Whether a run of these stages changes hosts (and so must hold the head's marker)."""
    return not check and any(stage not in READ_ONLY_STAGES for stage in stages)


def stale_seconds() -> float:
    try:
        hours = float(os.environ.get("GPUFLEET_RUN_MARKER_STALE_HOURS", STALE_HOURS))
    except ValueError:
        hours = STALE_HOURS
    return (
        hours * 3600 if math.isfinite(hours) and hours > 0 else STALE_HOURS * 3600
    )  # NaN, <= 0: the default


def stale_because(
    holder: RunHolder, now: float, me: str, limit: float, alive: Callable[[int], bool]
) -> str | None:
    """Why the marker of ``holder`` is stale (None: it holds the fleet). ``now`` is the head's clock."""
    if holder.run_id == "unreadable":
        return "the marker is unreadable"
    if holder.started and now - holder.started > limit:
        return f"it is {(now - holder.started) / 3600:.1f} h old, over the stale limit of {limit / 3600:g} h"
    if holder.control == me and holder.pid > 0 and not alive(holder.pid):
        return f"its process (pid {holder.pid}) is gone on this control node"
    return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


HeadCall = Callable[[list[str]], str]  # runs HOST_SCRIPT on the head with these arguments; its stdout


class HeadMarker:
    """Acquire and release a run's marker on the head through ``call`` (Ansible in production)."""

    def __init__(
        self,
        call: HeadCall,
        holder: RunHolder,
        *,
        path: PurePosixPath = MARKER_PATH,
        alive: Callable[[int], bool] = pid_alive,
        limit: float | None = None,
    ) -> None:
        self.call = call
        self.holder = holder
        self.path = path
        self.alive = alive
        self.limit = stale_seconds() if limit is None else limit
        self.written = False  # acquired: the run must release it

    def acquire(self, head: str = "the head") -> list[str]:
        """Write the marker; the warnings (a stale marker taken over). HeadBusyError: another run holds it."""
        answer = self._acquire("")
        if answer.get("taken"):
            self.written = True
            return []
        holder = RunHolder.read(answer.get("current") or {})
        why = stale_because(
            holder, float(answer.get("now") or time.time()), self.holder.control, self.limit, self.alive
        )
        if why is None:
            raise HeadBusyError(
                f"{head}: another gpufleet run holds this fleet: {holder.describe()}"
                f" (marker {self.path}). Fix: wait for it to finish, or stop it on {holder.control}; if it is"
                f" dead, remove {self.path} on {head} (a marker is stale after"
                f" {self.limit / 3600:g} h, GPUFLEET_RUN_MARKER_STALE_HOURS)"
            )
        again = self._acquire(holder.run_id)
        if not again.get("taken"):  # another run took it over between the two calls
            other = RunHolder.read(again.get("current") or {})
            raise HeadBusyError(f"{head}: another gpufleet run holds this fleet: {other.describe()}")
        self.written = True
        return [f"{head}: took over a stale run marker ({holder.describe()}): {why}"]

    def release(self) -> None:
        if self.written:
            self.call(["release", str(self.path), self.holder.run_id])
            self.written = False

    def _acquire(self, takeover: str) -> dict[str, Any]:
        wanted = {k: v for k, v in asdict(self.holder).items() if k != "started"}
        encoded = base64.b64encode(json.dumps(wanted).encode()).decode()
        out = self.call(["acquire", str(self.path), encoded, *([takeover] if takeover else [])])
        lines = [line for line in out.splitlines() if line.strip().startswith("{")]
        if not lines:
            raise HeadBusyError(
                f"the head's run marker could not be written: {out.strip()[-500:] or 'no answer'}"
            )
        answer = json.loads(lines[-1])
        return answer if isinstance(answer, dict) else {}


def script_argv(arguments: Sequence[str]) -> str:
    """The raw command that runs HOST_SCRIPT with ``arguments`` on a host (no file placed, nothing quoted
    but base64 and the arguments, which are paths, hex and base64)."""
    script = base64.b64encode(HOST_SCRIPT.encode()).decode()
    return f"echo {script} | base64 -d | python3 - " + " ".join(arguments)
