"""Cancel means stopped (issue 13 item 3), on the lab, mid-artifacts.

``gpufleet deploy --json`` of this checkout runs as a subprocess on fresh hosts of the session lab, from the
lab bundle, in a cgroup of its own (the pids hierarchy), so that every process it starts on this machine is
found after its exit however it daemonized or called setsid(). When the artifacts stage streams the serving
image through the relay, the test sends SIGINT to gpufleet (its pid only, as ``kill -INT`` does: nothing
reaches ansible-playbook or ssh but what gpufleet does itself), then asserts: gpufleet exits within
CANCEL_SECONDS with a canceled report; no process of the run is left on this machine nor on the hosts (no
docker load, no relay, no Ansible task or async job); the fleet lock and the head's run marker are gone; and
a following ``gpufleet deploy --stages artifacts`` completes, every host holding each image of the bundle
exactly once with the pinned ID.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO, VENV_BIN, RunningLab

from gpufleet.lab.demo import route_to_bridge
from gpufleet.runner.fleet_lock import fleet_lock
from gpufleet.runner.head_marker import MARKER_PATH, control_node

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]

CANCEL_SECONDS = 10.0
PIDS_CGROUP = Path("/sys/fs/cgroup/pids")
# What a run leaves on a host when it is not stopped: the relay, docker load, Ansible's module invocations
# (`/bin/sh -c '... && sleep 0'`, AnsiballZ) and async jobs (async_wrapper).
HOST_LEFTOVER = re.compile(r"gpufleet_relay|docker load|AnsiballZ|async_wrapper|ansible-tmp-|sleep 0")


@pytest.fixture
def run_cgroup() -> Iterator[Path]:
    """A pids cgroup for one gpufleet run (every descendant stays in it); removed after the test."""
    if not (PIDS_CGROUP / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
    group = PIDS_CGROUP / f"gpufleet-cancel-{os.getpid()}"
    group.mkdir(exist_ok=True)
    try:
        yield group
    finally:
        for pid in processes_in(group):  # only ever the test's own run
            with_suppressed_kill(pid)
        time.sleep(0.5)
        with contextlib.suppress(OSError):
            group.rmdir()


def with_suppressed_kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


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


def gpufleet(
    *args: str, state: Path, cgroup: Path | None = None, timeout: float = 1800
) -> subprocess.Popen[str]:
    env = dict(os.environ, XDG_STATE_HOME=str(state), PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    join = None
    if cgroup is not None:
        procs = str(cgroup / "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

    return subprocess.Popen(
        [str(VENV_BIN / "gpufleet"), *args],
        cwd=REPO,
        env=env,
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
        assert run.poll() is None, f"deploy ended before the transfer (exit {run.returncode}): " + (
            run.stderr.read()[-3000:] if run.stderr else ""
        )
        for host in lab.hosts:
            table = lab.ssh(host, ["ps", "-eo", "args"], timeout=30).stdout
            for line in table.splitlines():
                if "gpufleet_relay.py recv" in line and sha256 in line:
                    return f"{host}: {line}"
        time.sleep(0.5)
    pytest.fail(f"no image transfer seen within {limit:.0f} s")


def images_on(lab: RunningLab, host: str) -> list[tuple[str, str]]:
    listed = lab.ssh(
        host,
        ["docker", "image", "ls", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}"],
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    pairs = [line.split(maxsplit=1) for line in listed.stdout.splitlines() if line.strip()]
    return [(pair[0], pair[-1]) for pair in pairs]


def test_sigint_mid_artifacts_stops_every_process_and_a_rerun_completes(
    lab: RunningLab, lab_bundle: Path, run_cgroup: Path, tmp_path: Path
) -> None:
    inventory = lab.lab.reset().inventory
    route_to_bridge(lab.lab, lab.inventory)
    state = tmp_path / "state"
    try:
        run = gpufleet(
            "deploy",
            "-i",
            str(inventory),
            "--bundle",
            str(lab_bundle),
            "--json",
            state=state,
            cgroup=run_cgroup,
        )
        seen = wait_for_image_transfer(lab, run, limit=1500, sha256=serving_image_sha256(lab_bundle))
        time.sleep(1.0)  # bytes are flowing
        signalled = time.monotonic()
        run.send_signal(signal.SIGINT)
        try:
            stdout, stderr = run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            stdout, stderr = run.communicate()
        took = time.monotonic() - signalled
        # whatever the run left on this machine, the moment it exited
        left_here = describe(processes_in(run_cgroup))
        left_there = host_leftovers(lab)
        print(f"cancel: SIGINT during '{seen}'; gpufleet exited {run.returncode} after {took:.2f} s")

        assert run.returncode == 130, stderr[-3000:]
        report = json.loads(stdout)
        assert [stage["status"] for stage in report["stages"]][-1] == "canceled", report
        assert report["stages"][-1]["name"] == "artifacts", report
        assert took <= CANCEL_SECONDS, f"stopped after {took:.2f} s"
        assert left_here == [], left_here
        assert left_there == {}, left_there
        with fleet_lock(inventory, "test"):  # raises FleetBusyError while any run holds it
            pass
        head = lab.hosts[0]
        marker = lab.ssh(head, ["cat", str(MARKER_PATH)], timeout=30)
        assert marker.returncode != 0, f"the run's marker is still on {head}: {marker.stdout}"

        again = gpufleet(
            "deploy", "-i", str(inventory), "--bundle", str(lab_bundle), "--stages", "artifacts", "--json",
            state=state,
        )  # fmt: skip
        stdout, stderr = again.communicate(timeout=1800)
        assert again.returncode == 0, stdout[-3000:] + stderr[-3000:]
        lock = yaml.safe_load((lab_bundle / "bundle.lock.yml").read_text(encoding="utf-8"))
        for host in lab.hosts:
            images = images_on(lab, host)
            for image in lock["images"]:
                name = f"{image['name']}:{image['tag']}"
                assert [entry for entry in images if entry[0] == name] == [(name, image["id"])], (
                    host,
                    images,
                )
    finally:
        lab.lab.reset()


def put_marker(lab: RunningLab, host: str, **fields: object) -> None:
    text = json.dumps(fields)
    done = lab.lab.ssh(host, f"mkdir -p {MARKER_PATH.parent} && cat > {MARKER_PATH}", stdin=text, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_heads_marker_refuses_another_control_nodes_run_and_a_dead_one_is_taken_over(
    lab: RunningLab, tmp_path: Path
) -> None:
    """Item 4 on the lab, with `gpufleet teardown` (changes hosts, and is quick on fresh hosts)."""
    inventory, head = lab.inventory.inventory, lab.hosts[0]
    try:
        since = time.time() - 30
        put_marker(
            lab, head, run_id="0" * 32, control="ops@elsewhere", pid=4242, action="deploy", started=since
        )
        refused = gpufleet("teardown", "-i", str(inventory), "--json", state=tmp_path / "a")
        stdout, stderr = refused.communicate(timeout=600)
        assert refused.returncode == 2, stdout + stderr
        said = " ".join(json.loads(stdout)["problems"])
        assert (
            "another gpufleet run holds this fleet: deploy run 000000000000 of ops@elsewhere (pid 4242)"
            in said
        )
        assert "since " + time.strftime("%Y-%m-%d %H:%M", time.gmtime(since)) in said, said
        assert json.loads(lab.ssh(head, ["cat", str(MARKER_PATH)]).stdout)["control"] == "ops@elsewhere"

        gone = subprocess.Popen(["true"])
        gone.wait()
        put_marker(
            lab, head, run_id="1" * 32, control=control_node(), pid=gone.pid, action="deploy", started=since
        )
        taken = gpufleet("teardown", "-i", str(inventory), "--json", state=tmp_path / "b")
        stdout, stderr = taken.communicate(timeout=600)
        assert taken.returncode == 0, stdout[-3000:] + stderr[-3000:]
        warnings = json.loads(stdout)["warnings"]
        assert any(f"its process (pid {gone.pid}) is gone on this control node" in w for w in warnings), (
            warnings
        )
        assert lab.ssh(head, ["test", "-e", str(MARKER_PATH)]).returncode == 1  # released at the end
    finally:
        lab.ssh(head, ["rm", "-f", str(MARKER_PATH)])
