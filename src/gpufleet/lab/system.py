"""Small system helpers shared by the lab modules: running commands, paths, locks, prerequisites."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

# Debian package that provides each command the lab needs on the control node.
REQUIRED_COMMANDS: dict[str, str] = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "ip": "iproute2",
    "iptables": "iptables",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "mount": "mount",
}


class LabError(Exception):
    """A lab operation failed; the message says what was expected, what was found and the fix."""


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 120,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output and turn a failure into a LabError that names the command."""
    try:
        result = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise LabError(
            f"{argv[0]}: command not found. Fix: run `gpufleet lab up` for the prerequisite check."
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s.") from exc
    if check and result.returncode != 0:
        raise LabError(
            f"`{' '.join(argv)}` failed (exit {result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result


def cache_dir() -> Path:
    """Where built root file systems live: $XDG_CACHE_HOME/gpufleet/lab or ~/.cache/gpufleet/lab."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpufleet" / "lab"


def state_root() -> Path:
    """Where running labs keep hosts' upper dirs and state (on disk, not tmpfs: docker data lands here)."""
    return Path(os.environ.get("GPUFLEET_LAB_STATE_DIR", "/var/lib/gpufleet/lab"))


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing) for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def missing_prerequisites() -> list[str]:
    """One line per missing prerequisite, each with the command that installs it; empty when all is there."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append(f"lab: user: found uid {os.geteuid()}; expected root. Fix: run as root (sudo).")
    missing = sorted({pkg for cmd, pkg in REQUIRED_COMMANDS.items() if shutil.which(cmd) is None})
    if missing:
        problems.append(
            f"lab: packages: missing {', '.join(missing)}. Fix: apt-get install -y {' '.join(missing)}"
        )
    if "overlay" not in Path("/proc/filesystems").read_text():
        problems.append(
            "lab: kernel: no overlayfs. Fix: modprobe overlay (or boot a kernel with CONFIG_OVERLAY_FS)."
        )
    return problems
