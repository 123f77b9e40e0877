"""One lab host: overlay root, own cgroup subtree, systemd-nspawn boot, and a teardown that leaves nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.lab.system import LabError, file_lock, run, state_root


@dataclass(frozen=True)
class HostSpec:
    """Everything needed to boot or tear down one host (also stored in the lab's state file)."""

    hostname: str
    ip: str
    machine: str  # systemd-nspawn machine name; unique across labs (hostnames repeat between labs)
    netns: str
    workdir: Path  # holds upper/, work/, root/, docker/, console.log
    cgroups: tuple[str, ...]  # this host's cgroup directory in every hierarchy

    @property
    def root(self) -> Path:
        return self.workdir / "root"


def cgroup_dirs(lab: str, hostname: str) -> tuple[str, ...]:
    """This host's cgroup in every mounted hierarchy, nested under the caller's own cgroup.

    Nesting under the caller keeps the hosts inside whatever accounting the caller is subject to.
    """
    own = _own_cgroups()
    dirs = []
    for mount, key in _cgroup_mounts():
        if key in own:
            dirs.append(str(mount / own[key].lstrip("/") / "gpufleet-lab" / lab / hostname))
    return tuple(dirs)


def _own_cgroups() -> dict[str, str]:
    """Controller set (e.g. 'cpu', 'name=systemd', '' for cgroup2) -> this process's path in it."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own[",".join(sorted(controllers.split(",")))] = path
    return own


def _cgroup_mounts() -> list[tuple[Path, str]]:
    """(mount point, controller-set key) of every cgroup hierarchy mounted with its root at /."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields, (fstype, _source, options) = left.split(), right.split()[:3]
        if fields[3] != "/" or fstype not in ("cgroup", "cgroup2"):
            continue
        if fstype == "cgroup2":
            mounts.append((Path(fields[4]), ""))
            continue
        known = {"rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "xattr", "clone_children"}
        controllers = sorted(
            opt for opt in options.split(",") if opt not in known and "release_agent" not in opt
        )
        mounts.append((Path(fields[4]), ",".join(controllers)))
    return mounts


def make_cgroups(spec: HostSpec) -> None:
    """Create the host's cgroup in every hierarchy; a v1 cpuset one gets its cpus and mems first.

    Serialised machine-wide: hosts start in parallel threads and labs in parallel processes, and they
    share the ``gpufleet-lab`` (and lab) levels of the cpuset tree. Unlocked, one thread could see a shared
    parent whose ``cpuset.cpus`` another thread had just written but whose ``cpuset.mems`` it had not yet,
    copy the empty mems down, and leave a leaf that refuses every task with ENOSPC (which dash reports
    as "echo: I/O error"): the lab's boot flake (issue 18).
    """
    with file_lock(state_root() / ".cgroup.lock"):
        for directory in spec.cgroups:
            path = Path(directory)
            path.mkdir(parents=True, exist_ok=True)
            if (path / "cpuset.cpus").exists():
                _init_cpuset(path)


def remove_shared_cgroup_levels(spec: HostSpec) -> None:
    """rmdir ``gpufleet-lab/<lab>``, then ``gpufleet-lab``, where no other host or lab uses them.

    Under the same lock as make_cgroups, so another lab never loses a level between its mkdirs.
    """
    with file_lock(state_root() / ".cgroup.lock"):
        for directory in spec.cgroups:
            for level in (Path(directory).parent, Path(directory).parent.parent):
                with contextlib.suppress(OSError):  # not empty (another host or lab) or already gone
                    level.rmdir()


CPUSET_FILES = ("cpuset.cpus", "cpuset.mems")


def _cpuset_ready(path: Path) -> bool:
    """A v1 cpuset takes tasks only when both its cpus and its mems are non-empty."""
    return all((path / name).read_text().strip() for name in CPUSET_FILES)


def _init_cpuset(leaf: Path) -> None:
    """Copy cpus and mems down from the nearest ready ancestor to every level below it, top first.

    A level is ready only when both files are set: a level left half-written (a crash between the two
    writes) is filled in rather than trusted.
    """
    chain = [leaf]
    while not _cpuset_ready(chain[-1].parent):
        chain.append(chain[-1].parent)
    for path in reversed(chain):
        for name in CPUSET_FILES:
            if not (path / name).read_text().strip():
                (path / name).write_text((path.parent / name).read_text())
    if not _cpuset_ready(leaf):
        found = {name: (leaf / name).read_text().strip() for name in CPUSET_FILES}
        raise LabError(
            f"lab: cgroup {leaf}: cpuset found {found}; expected cpus and mems set from its parent. "
            f"Fix: check {leaf.parent}/cpuset.cpus and cpuset.mems, then `gpufleet lab down` and up again."
        )


def mount_root(spec: HostSpec, lowerdir: str) -> None:
    """Fresh overlay root; the caller removed any previous upper dir."""
    for sub in ("upper", "work", "root", "docker"):
        (spec.workdir / sub).mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={lowerdir},upperdir={spec.workdir / 'upper'},workdir={spec.workdir / 'work'}"
    run(["mount", "-t", "overlay", "overlay", "-o", options, str(spec.root)])


def write_identity(spec: HostSpec, peers: list[tuple[str, str]], *, offline: bool) -> None:
    """hostname, /etc/hosts naming every lab host by its lab address, resolv.conf."""
    etc = spec.root / "etc"
    (etc / "hostname").write_text(spec.hostname + "\n")
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{ip} {name}" for name, ip in peers]
    (etc / "hosts").unlink(missing_ok=True)
    (etc / "hosts").write_text("\n".join(lines) + "\n")
    resolv = etc / "resolv.conf"
    resolv.unlink(missing_ok=True)
    if offline:
        resolv.write_text("# offline lab: no name server; lab hosts are in /etc/hosts\n")
    else:
        resolv.write_text(Path("/etc/resolv.conf").read_text())


def boot(spec: HostSpec) -> None:
    """Start systemd-nspawn detached (setsid -f: the host outlives this process) from its own cgroups."""
    nspawn = [
        "systemd-nspawn",
        "--boot",
        f"--directory={spec.root}",
        f"--machine={spec.machine}",
        f"--hostname={spec.hostname}",
        # No machined/dbus here: --register=no; --keep-unit stops nspawn asking systemd for a scope.
        "--register=no",
        "--keep-unit",
        f"--network-namespace-path=/run/netns/{spec.netns}",
        "--console=read-only",
        # dockerd inside needs every capability (its iptables NAT chain) and a plain-directory data root.
        "--capability=all",
        f"--bind={spec.workdir / 'docker'}:/var/lib/docker",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
    ]
    # make_cgroups left every cgroup ready to take a task, so one failed join is a real error: name it.
    join = (
        'for d in $GPUFLEET_LAB_CGROUPS; do echo $$ > "$d/cgroup.procs" || '
        '{ echo "lab: cannot join cgroup $d" >&2; exit 97; }; done; exec "$@"'
    )
    env = dict(os.environ)
    env.update(
        GPUFLEET_LAB_CGROUPS=" ".join(spec.cgroups),
        SYSTEMD_NSPAWN_API_VFS_WRITABLE="1",
        SYSTEMD_SECCOMP="0",
    )
    with (spec.workdir / "console.log").open("w") as log:
        subprocess.run(
            ["setsid", "-f", "sh", "-c", join, "sh", *nspawn],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            check=True,
        )


def processes(spec: HostSpec) -> set[int]:
    """Every process in this host's cgroup subtree (any hierarchy)."""
    pids: set[int] = set()
    for directory in spec.cgroups:
        # os.walk, not Path.rglob: a sub-cgroup removed mid-walk is skipped instead of raising.
        for root, _dirs, files in os.walk(directory):
            if "cgroup.procs" not in files:
                continue
            try:
                pids.update(int(pid) for pid in Path(root, "cgroup.procs").read_text().split())
            except OSError:
                continue  # the cgroup went away while we walked
    return pids


KILL_TIMEOUT = 60.0  # seconds; a killed process in uninterruptible I/O (a busy disk) exits only when it ends
CGROUP_BUSY_TIMEOUT = 30.0  # seconds; a cgroup stays busy until its last task has exited and been reaped


def kill(spec: HostSpec, timeout: float = KILL_TIMEOUT) -> None:
    """SIGKILL everything in the host's cgroups; freezing first means nothing forks away meanwhile."""
    freezer = next((Path(d) for d in spec.cgroups if (Path(d) / "freezer.state").exists()), None)
    deadline = time.monotonic() + timeout
    while pids := processes(spec):
        if freezer is not None:
            (freezer / "freezer.state").write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer is not None:
            (freezer / "freezer.state").write_text("THAWED")
        if time.monotonic() > deadline:
            raise LabError(
                f"lab: {spec.hostname}: processes {sorted(pids)} survived SIGKILL for {timeout:.0f} s."
            )
        time.sleep(0.05)


def teardown(spec: HostSpec) -> None:
    """Kill, unmount the overlay, remove the netns and cgroups. Safe on a half-built or gone host."""
    kill(spec)
    _unmount(spec.root)
    run(["ip", "netns", "del", spec.netns], check=False)
    _forget(spec)


def power_off(spec: HostSpec) -> None:
    """Kill the host and remove its cgroups; its disk (the overlay, still mounted) stays for :func:`boot`."""
    kill(spec)
    _forget(spec)


def _forget(spec: HostSpec) -> None:
    """Remove what is left of a killed host: its cgroups, nspawn's propagate directory."""
    for directory in spec.cgroups:
        _remove_cgroup_tree(Path(directory))
    propagate = Path("/run/systemd/nspawn/propagate") / spec.machine
    if propagate.is_dir():
        for child in propagate.iterdir():
            child.unlink()
        propagate.rmdir()


def _unmount(path: Path) -> None:
    for _ in range(50):
        if not os.path.ismount(path):
            return
        if run(["umount", str(path)], check=False).returncode == 0:
            return
        time.sleep(0.1)
    run(["umount", "--lazy", str(path)])


def _remove_cgroup_tree(top: Path, timeout: float = CGROUP_BUSY_TIMEOUT) -> None:
    """rmdir the cgroup and its children, deepest first (busy for a moment while its last task exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not top.is_dir():
            return
        children = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        try:
            for directory in [*children, top]:
                directory.rmdir()
        except FileNotFoundError:
            pass  # a child went away on its own; look again
        except OSError:
            time.sleep(0.1)
    if top.is_dir():
        raise LabError(
            f"lab: cgroup {top}: still busy after {timeout:.0f} s. Fix: look at {top}/cgroup.procs, then down"
            " again."
        )
