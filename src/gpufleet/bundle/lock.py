"""bundle.lock.yml: every file of a bundle with size, sha256, version and source; and verifying a bundle.

The lock is written sorted and without timestamps so the same manifest always gives the same bytes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    ValidationError,
)

LOCK_NAME = "bundle.lock.yml"
SIGNATURE_NAME = LOCK_NAME + ".sig"  # ssh-keygen -Y sign of the lock (gpufleet.bundle.signature)
# Directories inside a bundle that belong to tools, not to the artifacts: a model clone's git metadata and
# the build's scratch space.
IGNORED_PARTS = frozenset({".git", ".work"})
_CHUNK = 1 << 20


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _inside_path(value: str) -> str:
    """A path inside the bundle: relative, POSIX, without "..", "." or empty parts."""
    parts = value.split("/")
    if not value or value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{value!r} is not a relative path inside the bundle (no leading /, no ..)")
    return value


BundlePath = Annotated[str, AfterValidator(_inside_path)]


def inside(root: Path, relpath: str) -> Path:
    """``root / relpath`` with symlinks resolved, refused when it leaves ``root`` (LockError)."""
    _inside_path(relpath)
    target = (root / relpath).resolve()
    if not target.is_relative_to(root.resolve()):
        raise LockError(
            f"{root / relpath}: resolves to {target}, outside the bundle {root}. "
            "Fix: remove the symlink, or rebuild the bundle with `gpufleet bundle build`."
        )
    return root / relpath


class LockedFile(_Model):
    path: BundlePath
    size: StrictInt = Field(ge=0)  # strict: YAML's true is not a size (pydantic would take it as 1)
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    version: str
    source: str


class LockedImage(_Model):
    """What a node needs to decide whether an image is already loaded."""

    name: str
    tag: str
    id: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
    path: BundlePath
    compression: Literal["none", "gzip", "zstd"]
    # Read from the image itself at build time (gpufleet.compat checks them against drivers and GPUs).
    cuda: str | None = None  # the CUDA it needs: NVIDIA_REQUIRE_CUDA, else CUDA_VERSION
    vllm: str | None = None
    ray: str | None = None  # None: the image holds no Ray (vLLM's mp executor then)
    torch: str | None = None
    python: str | None = None


class LockedModel(_Model):
    repo: str
    revision: str
    path: BundlePath
    url: str


class Lock(_Model):
    schema_version: Literal[1] = 1
    manifest: str
    files: list[LockedFile]
    images: list[LockedImage] = Field(default_factory=list)
    models: list[LockedModel] = Field(default_factory=list)

    def by_path(self) -> dict[str, LockedFile]:
        return {entry.path: entry for entry in self.files}


class LockError(Exception):
    """The lock file is missing or unreadable."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def lock_entry(root: Path, relpath: str, version: str, source: str) -> LockedFile:
    path = root / relpath
    return LockedFile(
        path=relpath, size=path.stat().st_size, sha256=sha256_file(path), version=version, source=source
    )


def dump_lock(lock: Lock) -> str:
    """The lock as YAML: keys and files sorted, nothing that changes between identical builds."""
    data = lock.model_dump()
    data["files"] = sorted(data["files"], key=lambda item: item["path"])
    data["images"] = sorted(data["images"], key=lambda item: item["path"])
    data["models"] = sorted(data["models"], key=lambda item: item["path"])
    header = "# Written by `gpufleet bundle build`; `gpufleet bundle verify` checks the bundle against it.\n"
    return header + yaml.safe_dump(data, sort_keys=True, default_flow_style=False, width=1000)


def write_lock(root: Path, lock: Lock) -> Path:
    target = root / LOCK_NAME
    tmp = target.with_suffix(".tmp")
    tmp.write_text(dump_lock(lock), encoding="utf-8")
    os.replace(tmp, target)
    return target


def read_lock(root: Path) -> Lock:
    return _read(root / LOCK_NAME, root)


def read_lock_at(path: Path) -> Lock:
    """A bundle directory's lock, or a lock file itself (a copy kept to compare an upgrade with)."""
    return _read(path, path.parent) if path.is_file() else read_lock(path)


def _read(path: Path, root: Path) -> Lock:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Lock.model_validate(data)
    except FileNotFoundError:
        raise LockError(
            f"{path}: missing; expected the lock written by `gpufleet bundle build`. "
            "Fix: point at a built bundle directory."
        ) from None
    except ValidationError as exc:
        where = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'top level'}: found "
            f"{_shown(error.get('input'))}; expected {error['msg'][0].lower()}{error['msg'][1:]}"
            for error in exc.errors()
        )
        raise LockError(
            f"{path}: unreadable: not a valid lock ({where}). Fix: rebuild it with `gpufleet bundle build`."
        ) from None
    except UnicodeDecodeError as exc:
        raise LockError(
            f"{path}: found bytes that are not UTF-8 at offset {exc.start}; expected the UTF-8 YAML text "
            "`gpufleet bundle build` writes. Fix: rebuild the bundle with `gpufleet bundle build`."
        ) from None
    except NotADirectoryError:
        raise LockError(
            f"{root}: found a file; expected a bundle directory holding {LOCK_NAME}. "
            "Fix: point at the directory `gpufleet bundle build --out` wrote."
        ) from None
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise LockError(
            f"{path}: unreadable ({first}). Fix: rebuild the bundle with `gpufleet bundle build`."
        ) from None


def _shown(value: object) -> str:
    """A found value for a message: short, and a mapping or list by its kind, not its whole content."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)[:80]


def bundle_files(root: Path) -> Iterator[str]:
    """Every file of a bundle directory, relative, skipping the lock, its signature and tool metadata."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_PARTS)
        for name in sorted(filenames):
            rel = Path(dirpath, name).relative_to(root).as_posix()
            if rel not in (LOCK_NAME, SIGNATURE_NAME) and not rel.endswith((".part", ".tmp")):
                yield rel


def check_file(root: Path, entry: LockedFile, *, quick: bool = False) -> str | None:
    """None when the file matches its lock entry, else one line saying what is wrong."""
    try:
        path = inside(root, entry.path)
    except LockError as escaped:
        return f"{entry.path}: escapes the bundle: {escaped}"
    if not path.is_file():
        return f"{entry.path}: missing; expected {entry.size} bytes (sha256 {entry.sha256[:12]}…)"
    size = path.stat().st_size
    if size != entry.size:
        return f"{entry.path}: corrupt: size {size}, expected {entry.size}"
    if not quick and (digest := sha256_file(path)) != entry.sha256:
        return f"{entry.path}: corrupt: sha256 {digest[:12]}…, expected {entry.sha256[:12]}…"
    return None


def verify_bundle(root: Path, lock: Lock | None = None) -> list[str]:
    """One line per problem: missing, corrupt and extra files (empty list = the bundle is good)."""
    lock = lock or read_lock(root)
    expected = lock.by_path()
    problems = [line for entry in lock.files if (line := check_file(root, entry)) is not None]
    problems += [f"{rel}: extra: not in {LOCK_NAME}" for rel in bundle_files(root) if rel not in expected]
    return sorted(problems)


def entries_intact(root: Path, entries: Iterable[LockedFile]) -> bool:
    """True when every entry exists with its recorded size and sha256 (used to skip re-fetching)."""
    entries = list(entries)
    return bool(entries) and all(check_file(root, entry) is None for entry in entries)
