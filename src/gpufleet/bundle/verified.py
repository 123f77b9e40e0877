"""Verifying a bundle on the control node before any host changes, fast enough to do on every run.

``gpufleet bundle verify`` hashes every byte (2.9 GB of the lab bundle: seconds; a real bundle with a 60 GB
model: minutes). preflight runs the same check (:func:`gpufleet.bundle.lock.check_file` per lock entry, the
same extra-file walk) but skips re-hashing a file whose identity is unchanged since it last matched: the
cache remembers, per file, (device, inode, size, mtime_ns, ctime_ns) and the sha256 it matched. ctime cannot
be set by a user (``touch -d`` sets mtime, and doing so moves ctime), so rewriting a file in place, replacing
it, or resetting its mtime all make the next run hash it again. The cache lives in the control node's user
cache (``$XDG_CACHE_HOME/gpufleet/verified/``), not in the bundle: bundles are often on read-only media, and
a cache beside the data could be edited together with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.bundle.lock import (
    LOCK_NAME,
    Lock,
    LockError,
    bundle_files,
    check_file,
    inside,
    read_lock,
    sha256_file,
)

Identity = list[int]


@dataclass(frozen=True)
class Verified:
    """What a cached verification found and what it cost."""

    problems: list[str]
    hashed: int  # files read in full this time
    trusted: int  # files whose identity matched the cache: not read
    seconds: float


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpufleet" / "verified"


def _identity(path: Path) -> Identity:
    info = path.stat()
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _cache_file(root: Path, cache: Path) -> Path:
    return cache / (hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:24] + ".json")


def _load(path: Path) -> dict[str, list[object]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def verify_cached(root: Path, *, cache: Path | None = None, lock: Lock | None = None) -> Verified:
    """One line per missing, corrupt or extra file, as ``gpufleet bundle verify`` says them.

    Raises LockError when the lock is missing or unreadable. ``cache=None`` uses :func:`cache_dir`.
    """
    began = time.monotonic()
    lock = lock or read_lock(root)
    cache_path = _cache_file(root, cache or cache_dir())
    known = _load(cache_path)
    fresh: dict[str, list[object]] = {}
    problems: list[str] = []
    hashed = trusted = 0
    for entry in lock.files:
        try:
            path = inside(root, entry.path)
            identity: Identity | None = _identity(path) if path.is_file() else None
        except (LockError, OSError):
            identity = None
        if identity is not None and known.get(entry.path) == [*identity, entry.sha256]:
            trusted += 1
            fresh[entry.path] = [*identity, entry.sha256]
            continue
        problem = check_file(root, entry)
        hashed += identity is not None
        if problem is not None:
            problems.append(problem)
        elif identity is not None and _identity(path) == identity:  # unchanged while it was hashed
            fresh[entry.path] = [*identity, entry.sha256]
    expected = lock.by_path()
    problems += [f"{rel}: extra: not in {LOCK_NAME}" for rel in bundle_files(root) if rel not in expected]
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"bundle": str(root.resolve()), "files": fresh}), encoding="utf-8")
        os.replace(tmp, cache_path)
    except OSError:
        pass  # no cache: the next run hashes again, nothing else changes
    return Verified(sorted(problems), hashed, trusted, round(time.monotonic() - began, 3))


def file_sha256(path: Path, *, root: Path | None = None, cache: Path | None = None) -> str:
    """``path``'s sha256, read from the disk, or from bundle ``root``'s cache when the last verification
    (:func:`verify_cached`, the preflight's) matched this very file: the same identity, so the same bytes.
    "" when there is no such file. The image_distribution role's check of its archives before sending."""
    try:
        identity = _identity(path)
    except OSError:
        return ""
    if root is not None:
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = ""
        entry = _load(_cache_file(root, cache or cache_dir())).get(rel) if rel else None
        if isinstance(entry, list) and entry[:-1] == identity and isinstance(entry[-1], str):
            return entry[-1]
    try:
        return sha256_file(path)
    except OSError:
        return ""
