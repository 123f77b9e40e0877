"""The lab hosts' root file system: a cached debootstrap base plus a small baked-in layer on top.

Hosts mount ``lowerdir=<layer>:<base>`` with their own upper dir. The base (slow: debootstrap) is keyed
by suite, package list and mirror; the layer (instant) by the base key and every file baked into it, so
changing a baked file rebuilds only the layer, and changing the package list rebuilds both.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.lab.system import LabError, cache_dir, file_lock, run

SUITES = ("bookworm", "trixie")
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

# What Ansible, the roles and the tests need on a bare host. No docker: the project's docker role installs it.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "iproute2",
    "iputils-ping",
    "procps",
    "sudo",
    "ca-certificates",
    "iptables",
    "kmod",
    "curl",
    "xz-utils",
    "gnupg",
)

# Units that only cost boot time, or have nothing to do, in a container: timers, consoles, pstore,
# kernel file systems nspawn already provides, module loading, fstab remounts, journal flushing.
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "e2scrub_reap.service",
    "systemd-pstore.service",
    "getty@tty1.service",
    "console-getty.service",
    "dev-hugepages.mount",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount",
    "modprobe@.service",
    "systemd-remount-fs.service",
    "systemd-journal-flush.service",
    "systemd-sysusers.service",
    "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service",
)

# Generators with nothing to find in a lab host (no fstab, disks, consoles, kernel command line, rc.local).
# Booting is CPU-bound on a busy machine: masking these and the last three units above cuts the CPU of a
# boot by about a third. systemd-sysv-generator stays: a package with only an init script must work.
MASKED_GENERATORS = (
    "systemd-cryptsetup-generator",
    "systemd-debug-generator",
    "systemd-fstab-generator",
    "systemd-getty-generator",
    "systemd-gpt-auto-generator",
    "systemd-hibernate-resume-generator",
    "systemd-integritysetup-generator",
    "systemd-rc-local-generator",
    "systemd-run-generator",
    "systemd-system-update-generator",
    "systemd-veritysetup-generator",
)

# nspawn mounts the cgroup v1 controllers read-only; dockerd inside then fails with
# "mkdir /sys/fs/cgroup/cpuset/docker/...: read-only file system". Ordered before docker only, so it
# does not delay boot-to-SSH.
CGROUP_RW_UNIT = """\
[Unit]
Description=Remount cgroup v1 controller mounts read-write (dockerd inside lab hosts)
DefaultDependencies=no
ConditionVirtualization=container
Before=containerd.service docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for m in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$m" 2>/dev/null; done; true'

[Install]
WantedBy=multi-user.target
"""

# nspawn mounts /sys before the host joins its network namespace, so /sys/class/net would list the
# machine's interfaces, not the host's: Ansible's facts (and preflight's NIC check) would see the wrong
# NICs. A sysfs mounted from inside the namespace shows the host's own devices; bind its net views over.
NETNS_SYSFS_UNIT = """\
[Unit]
Description=Show this host's own network devices in /sys/class/net
DefaultDependencies=no
ConditionVirtualization=container
Before=network-pre.target ssh.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'mkdir -p /run/netns-sysfs && mount -t sysfs sysfs /run/netns-sysfs && \\
  mount --bind /run/netns-sysfs/class/net /sys/class/net && \\
  mount --bind /run/netns-sysfs/devices/virtual/net /sys/devices/virtual/net'

[Install]
WantedBy=multi-user.target
"""

LAYER_FILES = {
    # Empty machine-id: systemd makes a fresh one per boot, so hosts do not share an identity.
    "etc/machine-id": "",
    # Reverse DNS of 10.231.x.x would wait for a resolver the offline lab does not have.
    "etc/ssh/sshd_config.d/gpufleet-lab.conf": "UseDNS no\n",
    # Hosts live seconds to minutes: keep the journal in memory (journalctl still works).
    "etc/systemd/journald.conf.d/gpufleet-lab.conf": "[Journal]\nStorage=volatile\n",
    "etc/systemd/system/cgroup-rw.service": CGROUP_RW_UNIT,
    "etc/systemd/system/netns-sysfs.service": NETNS_SYSFS_UNIT,
}
LAYER_LINKS = {
    **{f"etc/systemd/system/{unit}": "/dev/null" for unit in MASKED_UNITS},
    **{f"etc/systemd/system-generators/{name}": "/dev/null" for name in MASKED_GENERATORS},
    **{
        f"etc/systemd/system/multi-user.target.wants/{unit}": f"/etc/systemd/system/{unit}"
        for unit in ("cgroup-rw.service", "netns-sysfs.service")
    },
}


@dataclass(frozen=True)
class RootFs:
    """A built root file system (overlay lower dirs, top first) and the SSH key root accepts on it."""

    lower: tuple[Path, ...]
    key: Path
    suite: str
    build_seconds: float  # 0 when everything came from the cache

    @property
    def lowerdir(self) -> str:
        return ":".join(str(path) for path in self.lower)


def _digest(material: object) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def base_key(suite: str, mirror: str) -> str:
    return _digest({"suite": suite, "packages": PACKAGES, "mirror": mirror})


def layer_key(suite: str, mirror: str) -> str:
    return _digest({"base": base_key(suite, mirror), "files": LAYER_FILES, "links": LAYER_LINKS})


def ensure_rootfs(suite: str = DEFAULT_SUITE, mirror: str | None = None) -> RootFs:
    """The cached root file system for ``suite``; builds what is missing, under a lock per piece."""
    if suite not in SUITES:
        raise LabError(f"lab: --suite: found {suite!r}; expected one of {', '.join(SUITES)}.")
    mirror = mirror or os.environ.get("GPUFLEET_LAB_MIRROR", DEFAULT_MIRROR)
    started = time.monotonic()
    base = _cached(
        cache_dir() / f"base-{suite}-{base_key(suite, mirror)}", lambda d: _debootstrap(d, suite, mirror)
    )
    layer = _cached(
        cache_dir() / f"layer-{suite}-{layer_key(suite, mirror)}", lambda d: _bake(d, base / "root")
    )
    built = time.monotonic() - started
    return RootFs((layer / "root", base / "root"), layer / "id_ed25519", suite, built if built > 1 else 0.0)


def _cached(final: Path, build: Callable[[Path], None]) -> Path:
    """``final`` if it exists, else build it in ``final``.partial and rename (concurrent callers wait)."""
    if final.is_dir():
        return final
    with file_lock(final.with_name(final.name + ".lock")):
        if final.is_dir():  # another `up` built it while we waited for the lock
            return final
        partial = final.with_name(final.name + ".partial")
        _unmount_below(partial)  # a crashed debootstrap leaves proc mounted in its target
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        build(partial)
        partial.rename(final)
    return final


def _unmount_below(path: Path) -> None:
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{path}/")), key=len, reverse=True):
        run(["umount", "--lazy", mount], check=False)


def _debootstrap(target: Path, suite: str, mirror: str) -> None:
    debs = cache_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    argv = ["debootstrap", "--variant=minbase", f"--cache-dir={debs}", f"--include={','.join(PACKAGES)}"]
    run([*argv, suite, str(target / "root"), mirror], timeout=900)
    for deb in (target / "root/var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


def _bake(target: Path, base: Path) -> None:
    """The layer: LAYER_FILES, LAYER_LINKS and root's authorized_keys, with directories like the base's.

    The topmost overlay layer decides a merged directory's mode and owner, so each directory made here
    copies them from the base (root's home must stay 0700 for sshd).
    """
    key = target / "id_ed25519"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpufleet-lab", "-f", str(key)])
    files = {**LAYER_FILES, "root/.ssh/authorized_keys": key.with_suffix(".pub").read_text()}
    root = target / "root"
    for relative in [*files, *LAYER_LINKS]:
        _make_parents(root, base, Path(relative).parent)
    for relative, content in files.items():
        (root / relative).write_text(content)
    (root / "root/.ssh/authorized_keys").chmod(0o600)
    for relative, link in LAYER_LINKS.items():
        (root / relative).symlink_to(link)


def _make_parents(root: Path, base: Path, relative: Path) -> None:
    for part in reversed([relative, *relative.parents][:-1]):
        made, model = root / part, base / part
        if made.is_dir():
            continue
        made.mkdir(parents=True)
        if model.is_dir():
            stat = model.stat()
            made.chmod(stat.st_mode & 0o7777)
            os.chown(made, stat.st_uid, stat.st_gid)
        elif part == Path("root/.ssh"):
            made.chmod(0o700)
