"""gpufleet's own wheel in a bundle, built so that the same commit gives the same bytes.

A wheel is a zip: every entry carries a time and a mode. setuptools writes the dist-info files it generates
with the current time unless ``SOURCE_DATE_EPOCH`` is set, and copies the other files' modes from the disk
(a checkout made under umask 002 gives 0664 where another gives 0644). An in-tree build also reuses
``build/lib``, where a file deleted from the sources lingers. So the wheel is built from a scratch copy of the
source tree, modes normalised to 0644 or 0755 (git's two), with ``SOURCE_DATE_EPOCH`` taken from:

* the commit's time (``git log -1 --format=%ct``) in a git checkout;
* without git (an unpacked source tarball): ``$SOURCE_DATE_EPOCH`` if set, else 315532800
  (1980-01-01T00:00:00Z, the earliest time a zip can hold): no time of the machine or the build enters.

With no source tree at all (gpufleet installed from a wheel) the wheel is downloaded from the package index by
version, as an upstream artifact. The lock's ``source`` names the commit (or the tree's digest), so a bundle
says which gpufleet built it and a rebuild from another commit does not reuse the old wheel.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gpufleet._version import __version__
from gpufleet.bundle.fetch import run
from gpufleet.paths import project_root

ZIP_EPOCH = 315532800  # 1980-01-01T00:00:00Z: the earliest time a zip entry can hold
# Directories of a checkout without git that are never sources (tools' caches, builds, environments).
NOT_SOURCES = frozenset(
    {".git", ".venv", "venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
    | {".tox", ".ansible", ".gpufleet"}
)


@dataclass(frozen=True)
class SourceTree:
    """The source tree gpufleet's wheel is built from, and what makes the build reproducible."""

    root: Path
    files: tuple[str, ...]  # relative POSIX paths, sorted
    epoch: int  # SOURCE_DATE_EPOCH for the build
    commit: str | None  # HEAD's commit; None without git
    changed: tuple[str, ...]  # files that differ from the commit (git status), sorted

    def digest(self) -> str:
        """sha256 over every file's path, executable bit and content (a symlink: its target)."""
        digest = hashlib.sha256()
        for rel in self.files:
            path = self.root / rel
            if path.is_symlink():
                kind, content = "l", os.readlink(path).encode()
            else:
                kind, content = ("x" if path.stat().st_mode & 0o111 else "-"), path.read_bytes()
            digest.update(f"{rel}\0{kind}\0{hashlib.sha256(content).hexdigest()}\n".encode())
        return digest.hexdigest()

    def describe(self) -> str:
        """The lock's words for where the wheel came from."""
        if self.commit is None:
            return f"gpufleet {__version__} from a source tree without git (tree sha256 {self.digest()[:16]})"
        if self.changed:
            return (
                f"gpufleet {__version__} from commit {self.commit} with uncommitted changes "
                f"(tree sha256 {self.digest()[:16]})"
            )
        return f"gpufleet {__version__} from commit {self.commit}"


def _git(root: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60, check=False
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def _walk(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in NOT_SOURCES and not d.endswith(".egg-info"))
        found += [Path(dirpath, name).relative_to(root).as_posix() for name in filenames]
    return sorted(found)


def _environment_epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.isdigit() else ZIP_EPOCH


def source_tree(root: Path) -> SourceTree:
    """The files a build of ``root`` takes (git's view: tracked and untracked, not ignored) and its epoch."""
    head = _git(root, "log", "-1", "--format=%H %ct")
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    status = _git(root, "status", "--porcelain", "-z", "--untracked-files=all", "--", ".")
    if head is None or listed is None or status is None or not head.strip():
        return SourceTree(root, tuple(_walk(root)), _environment_epoch(), None, ())
    commit, epoch = head.split()
    files = sorted({rel for rel in listed.split("\0") if rel and os.path.lexists(root / rel)})
    # porcelain -z: "XY path", a rename followed by its old path as an entry of its own
    changed = sorted({entry[3:] for entry in status.split("\0") if len(entry) > 3 and entry[2] == " "})
    return SourceTree(root, tuple(files), max(int(epoch), ZIP_EPOCH), commit, tuple(changed))


def copy_tree(tree: SourceTree, dest: Path) -> None:
    """The tree's files into ``dest`` with modes 0644 or 0755 and directories 0755, whatever the umask."""
    for rel in tree.files:
        source, target = tree.root / rel, dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
            continue
        shutil.copyfile(source, target)
        target.chmod(0o755 if source.stat().st_mode & 0o111 else 0o644)
    for dirpath, _dirnames, _filenames in os.walk(dest):
        Path(dirpath).chmod(0o755)


def checkout() -> SourceTree | None:
    """The source tree this gpufleet runs from; None when it runs from an installed wheel."""
    root = project_root()
    if root is None or not (root / "pyproject.toml").is_file():
        return None
    return source_tree(root)


def describe_origin() -> str:
    """Where ``build_wheel`` takes the wheel from, in the lock's words."""
    tree = checkout()
    return tree.describe() if tree is not None else f"gpufleet {__version__} from the package index"


def build_wheel(work: Path, dest: Path) -> list[str]:
    """gpufleet's wheel into ``dest``; returns what about it a rebuild may not reproduce (one line each)."""
    tree = checkout()
    if tree is None:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest)]
        run([*command, f"gpufleet=={__version__}"], what="gpufleet's wheel")
        return []
    scratch = work / "gpufleet-source"
    shutil.rmtree(scratch, ignore_errors=True)
    copy_tree(tree, scratch)
    built = work / "gpufleet-wheel"
    shutil.rmtree(built, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(built), str(scratch)]
    run(command, what="gpufleet's wheel", env={"SOURCE_DATE_EPOCH": str(tree.epoch)})
    notes = []
    for wheel in sorted(built.glob("*.whl")):
        notes.append(_generator_note(wheel))
        os.replace(wheel, dest / wheel.name)
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(built, ignore_errors=True)
    if tree.changed:
        shown = ", ".join(tree.changed[:3]) + (", ..." if len(tree.changed) > 3 else "")
        notes.append(
            f"gpufleet's wheel: built from {tree.root} with {len(tree.changed)} uncommitted change(s) "
            f"({shown}): only this same tree rebuilds it, not commit {tree.commit}. "
            "Fix: commit or stash them for a bundle that the commit reproduces"
        )
    return notes


def _generator_note(wheel: Path) -> str:
    """The build backend is fetched by pip for the build (pyproject.toml's build-system.requires)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [name for name in archive.namelist() if name.endswith(".dist-info/WHEEL")]
        text = archive.read(names[0]).decode() if names else ""
    match = re.search(r"^Generator: (.+)$", text, re.MULTILINE)
    generator = match[1].strip() if match else "an unknown generator"
    return (
        f"gpufleet's wheel: written by {generator}, the build backend pip took for pyproject.toml's "
        "build-system.requires (not pinned): another release of it can change the wheel's bytes"
    )
