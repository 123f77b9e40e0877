"""Offline bundles: the manifest (what to fetch), the fetchers (files, Debian packages, images, git-lfs
models), the lock (every artifact with its sha256) and verification.

Every reader of a built bundle goes through :mod:`~gpufleet.bundle.lock` (the lookup plugin too).
"""

from __future__ import annotations

from gpufleet.bundle.build import BuildError, BuildResult, build, load_manifest, verify
from gpufleet.bundle.lock import Lock, LockError, read_lock, sha256_file
from gpufleet.bundle.manifest import ManifestError

__all__ = [
    "BuildError",
    "BuildResult",
    "Lock",
    "LockError",
    "ManifestError",
    "build",
    "load_manifest",
    "read_lock",
    "sha256_file",
    "verify",
]
