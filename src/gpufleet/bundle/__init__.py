"""Offline bundles: the manifest (what to fetch), the fetchers (files, Debian packages, images, git-lfs
models), the lock (every artifact with its sha256), verification, the lock's SSH signature and lock diffs.

Every reader of a built bundle goes through :mod:`~gpufleet.bundle.lock` (the lookup plugin too).
"""

from __future__ import annotations

from gpufleet.bundle.build import BuildError, BuildResult, build, load_manifest, verify
from gpufleet.bundle.diff import diff_locks
from gpufleet.bundle.lock import Lock, LockError, read_lock, sha256_file
from gpufleet.bundle.manifest import ManifestError
from gpufleet.bundle.signature import SignatureError, Signer

__all__ = [
    "BuildError",
    "BuildResult",
    "Lock",
    "LockError",
    "ManifestError",
    "SignatureError",
    "Signer",
    "build",
    "diff_locks",
    "load_manifest",
    "read_lock",
    "sha256_file",
    "verify",
]
