"""The model in a bundle: a git-lfs clone at the pinned revision, verified against its LFS pointers.

The clone is made with ``GIT_LFS_SKIP_SMUDGE=1`` and filled by ``git lfs pull`` with raised
``lfs.concurrenttransfers`` (git-lfs resumes partly downloaded objects on a rerun). After verification the
objects under ``.git/lfs`` are deleted: the checked-out files are the only copy, so the bundle does not hold
every weight twice.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from gpufleet.bundle.fetch import BuildError, run
from gpufleet.bundle.lock import sha256_file

SKIP_SMUDGE = {"GIT_LFS_SKIP_SMUDGE": "1", "GIT_TERMINAL_PROMPT": "0"}


def git(repo: Path, *args: str, what: str, env: dict[str, str] | None = None) -> str:
    return run(["git", "-C", str(repo), *args], what=what, env={**SKIP_SMUDGE, **(env or {})})


def lfs_pointers(repo: Path, what: str) -> dict[str, str]:
    """path -> sha256 of every LFS-tracked file at HEAD (the pointer's oid is the content's sha256)."""
    out = git(repo, "lfs", "ls-files", "--long", what=what)
    pointers = {}
    for line in out.splitlines():
        oid, _marker, path = line.split(" ", 2)
        pointers[path] = oid
    return pointers


def verify_checkout(repo: Path, revision: str, what: str) -> list[str]:
    """Problems with a checkout: wrong revision, LFS files whose content does not match their pointer."""
    head = git(repo, "rev-parse", "HEAD", what=what).strip()
    if head != revision:
        return [f"{what}: HEAD is {head}, expected {revision}"]
    problems = []
    for path, oid in sorted(lfs_pointers(repo, what).items()):
        target = repo / path
        if not target.is_file():
            problems.append(f"{what}: {path}: missing")
        elif (digest := sha256_file(target)) != oid:
            problems.append(f"{what}: {path}: sha256 {digest[:12]}…, expected {oid[:12]}… (LFS pointer)")
    return problems


def _has(repo: Path, revision: str) -> bool:
    try:
        git(repo, "cat-file", "-e", f"{revision}^{{commit}}", what=str(repo))
    except BuildError:
        return False
    return True


def _resolve(dest: Path, revision: str, what: str) -> str:
    """The commit a revision names; branches and tags are fetched afresh, a known commit is not."""
    if re.fullmatch(r"[0-9a-f]{40}", revision) and _has(dest, revision):
        return revision
    git(dest, "fetch", "--quiet", "--tags", "origin", what=what)
    for candidate in (f"origin/{revision}", f"refs/tags/{revision}", revision):
        if _has(dest, candidate):
            return git(dest, "rev-parse", f"{candidate}^{{commit}}", what=what).strip()
    raise BuildError(f"{what}: the remote has no revision {revision!r}. Fix: pin an existing commit or tag.")


def fetch_model(url: str, revision: str, dest: Path, *, concurrency: int) -> str:
    """Make ``dest`` a verified clone of ``url`` at ``revision``; returns the commit checked out."""
    what = f"model {url}@{revision}"
    if not (dest / ".git").is_dir():
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        run(["git", "clone", "--quiet", "--no-checkout", url, str(dest)], what=what, env=SKIP_SMUDGE)
    commit = _resolve(dest, revision, what)
    if not verify_checkout(dest, commit, what):
        return commit
    git(dest, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--force", commit, what=what)
    git(dest, "-c", f"lfs.concurrenttransfers={concurrency}", "lfs", "pull", what=what)
    problems = verify_checkout(dest, commit, what)
    if problems:
        raise BuildError(
            "; ".join(problems) + ". Fix: rerun the build (objects are fetched again); if it "
            "persists the remote serves corrupt LFS objects."
        )
    shutil.rmtree(dest / ".git" / "lfs" / "objects", ignore_errors=True)
    return commit


def head_commit(repo: Path) -> str:
    """The commit a bundle's model clone has checked out."""
    return git(repo, "rev-parse", "HEAD", what=str(repo)).strip()
