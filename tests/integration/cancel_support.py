"""Cancel means stopped (issue 13 item 3): a ``gpufleet deploy`` interrupted with SIGINT mid-artifacts.

The run starts in a cgroup of its own (the pids hierarchy), so that every process it starts on this machine is
found after its exit however it daemonized or called setsid(). When the artifacts stage streams the serving
image through the relay, SIGINT goes to gpufleet (its pid only, as ``kill -INT`` does: nothing reaches
ansible-playbook or ssh but what gpufleet does itself). :func:`cancel_mid_artifacts` records, the moment it
exited, what it left here and on the hosts, whether the fleet lock is free and whether the head's run marker
is gone; the end-to-end module (test_e2e.py) interrupts its first deploy this way, asserts on the record,
and then deploys the fleet for real from where the cancel left it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from conftest import RunningLab

from gpufleet.runner.fleet_lock import FleetBusyError, fleet_lock
from gpufleet.runner.head_marker import MARKER_PATH

CANCEL_SECONDS = 10.0
PIDS_CGROUP = Path("/sys/fs/cgroup/pids")
# What a run leaves on a host when it is not stopped: the relay, docker load, Ansible's module invocations
# (`/bin/sh -c '... && sleep 0'`, AnsiballZ) and async jobs (async_wrapper).
HOST_LEFTOVER = re.compile(r"gpufleet_relay|docker load|AnsiballZ|async_wrapper|ansible-tmp-|sleep 0")


@dataclass(frozen=True)
class Canceled:
    """What one interrupted run did and left, taken the moment it exited."""

    seen: str  # the relay receiver's process line that showed the transfer under way
    returncode: int | None
    stdout: str
    stderr: str
    took: float  # seconds from SIGINT to exit
    left_here: list[str]  # processes of the run still alive on this machine
    left_there: dict[str, list[str]]  # per host: processes of the run still alive there
    lock_busy: str  # FleetBusyError's message when the fleet lock was still held; "" when free
    marker: str  # the head's run marker when still there; "" when gone


@contextlib.contextmanager
def run_cgroup(name: str) -> Iterator[Path]:
    """A pids cgroup for one gpufleet run (every descendant stays in it); emptied and removed after."""
    group = PIDS_CGROUP / name
    group.mkdir(exist_ok=True)
    try:
        yield group
    finally:
        for pid in processes_in(group):  # only ever the test's own run
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        with contextlib.suppress(OSError):
            group.rmdir()


def cgroups_available() -> bool:
    return (PIDS_CGROUP / "cgroup.procs").exists()


def processes_in(group: Path) -> list[int]:
    text = (group / "cgroup.procs").read_text()
    return [int(line) for line in text.split() if line.strip()]


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            out.append(f"{pid}: (gone)")
    return out


def start_in(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], cgroup: Path | None = None
) -> subprocess.Popen[str]:
    """``argv`` as a subprocess with piped output; in ``cgroup`` (joined before exec) when one is given."""
    join = None
    if cgroup is not None:
        procs = str(cgroup / "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=join,  # noqa: PLW1509  (joins the cgroup before exec: every descendant is in it)
    )


def host_leftovers(lab: RunningLab) -> dict[str, list[str]]:
    found = {}
    for host in lab.hosts:
        table = lab.ssh(host, ["ps", "-eo", "pid,ppid,args"], timeout=30).stdout.splitlines()
        left = [line for line in table[1:] if HOST_LEFTOVER.search(line) and "ps -eo" not in line]
        if left:
            found[host] = left
    return found


def serving_image_sha256(bundle: Path) -> str:
    """The serving image archive's sha256, which its relay receivers carry in their command line."""
    lock = yaml.safe_load((bundle / "bundle.lock.yml").read_text(encoding="utf-8"))
    archive = next(image["path"] for image in lock["images"] if "vllm" in image["name"])
    return str(next(entry["sha256"] for entry in lock["files"] if entry["path"] == archive))


def wait_for_image_transfer(lab: RunningLab, run: subprocess.Popen[str], limit: float, sha256: str) -> str:
    """Poll the hosts until a relay receives the serving image (loading it as it arrives); the host's line."""
    ended = time.monotonic() + limit
    while time.monotonic() < ended:
        if run.poll() is not None:
            raise AssertionError(
                f"deploy ended before the transfer (exit {run.returncode}): "
                + (run.stderr.read()[-3000:] if run.stderr else "")
            )
        for host in lab.hosts:
            table = lab.ssh(host, ["ps", "-eo", "args"], timeout=30).stdout
            for line in table.splitlines():
                if "gpufleet_relay.py recv" in line and sha256 in line:
                    return f"{host}: {line}"
        time.sleep(0.5)
    raise AssertionError(f"no image transfer seen within {limit:.0f} s")


def cancel_mid_artifacts(
    lab: RunningLab, inventory: Path, bundle: Path, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]
) -> Canceled:
    """Start ``argv`` (a ``gpufleet deploy`` of ``inventory`` from ``bundle``) in a cgroup of its own, SIGINT
    it once the serving image is streaming, and record what it did and left."""
    with run_cgroup(f"gpufleet-cancel-{os.getpid()}") as cgroup:
        run = start_in(argv, cwd=cwd, env=env, cgroup=cgroup)
        try:
            seen = wait_for_image_transfer(lab, run, limit=1500, sha256=serving_image_sha256(bundle))
            time.sleep(1.0)  # bytes are flowing
            signalled = time.monotonic()
            run.send_signal(signal.SIGINT)
            try:
                stdout, stderr = run.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()
                stdout, stderr = run.communicate()
            took = time.monotonic() - signalled
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
        left_here = describe(processes_in(cgroup))  # whatever the run left on this machine, at its exit
    left_there = host_leftovers(lab)
    busy = ""
    try:
        with fleet_lock(inventory, "test"):  # raises FleetBusyError while any run holds it
            pass
    except FleetBusyError as error:
        busy = str(error)
    marker = lab.ssh(lab.hosts[0], ["cat", str(MARKER_PATH)], timeout=30)
    print(f"cancel: SIGINT during '{seen}'; gpufleet exited {run.returncode} after {took:.2f} s")
    return Canceled(
        seen=seen,
        returncode=run.returncode,
        stdout=stdout,
        stderr=stderr,
        took=took,
        left_here=left_here,
        left_there=left_there,
        lock_busy=busy,
        marker=marker.stdout if marker.returncode == 0 else "",
    )


def images_on(lab: RunningLab, host: str) -> list[tuple[str, str]]:
    listed = lab.ssh(
        host,
        ["docker", "image", "ls", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}"],
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    pairs = [line.split(maxsplit=1) for line in listed.stdout.splitlines() if line.strip()]
    return [(pair[0], pair[-1]) for pair in pairs]
