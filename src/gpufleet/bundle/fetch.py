"""Getting single files into a bundle: HTTP downloads resumed with Range, local copies, sha256 checks."""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from gpufleet.bundle.lock import sha256_file

_CHUNK = 1 << 20


class BuildError(Exception):
    """A bundle artifact could not be fetched or did not verify; the message names it and the fix."""


@dataclass
class BuildContext:
    """What every fetcher needs: where the bundle goes, where relative paths start, how to report."""

    out: Path
    manifest_dir: Path
    console: Console = field(default_factory=lambda: Console(stderr=True))
    trust_first_download: bool = False
    work: Path = field(init=False)

    def __post_init__(self) -> None:
        self.work = self.out / ".work"

    def progress(self) -> Progress:
        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )

    def local(self, path: str) -> Path:
        candidate = Path(path)
        return candidate if candidate.is_absolute() else self.manifest_dir / candidate


def run(
    argv: Sequence[str],
    *,
    what: str,
    env: dict[str, str] | None = None,
    timeout: float = 3600,
    cwd: Path | None = None,
) -> str:
    """Run a tool; a failure becomes a BuildError that names the artifact and the command."""
    try:
        result = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
    except FileNotFoundError:
        raise BuildError(
            f"{what}: `{argv[0]}` is not installed. Fix: install it on the build machine."
        ) from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what}: `{' '.join(argv)}` did not finish within {timeout:.0f} s.") from None
    if result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-3:]
        raise BuildError(
            f"{what}: `{' '.join(argv)}` failed (exit {result.returncode}): {' | '.join(detail)}"
        )
    return result.stdout


def _check_digest(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        path.unlink()
        raise BuildError(
            f"{what}: sha256 {actual}, expected {expected}; the download was removed. "
            "Fix: check the URL, or correct sha256 in the manifest if the upstream file changed."
        )


def _open(url: str, offset: int) -> tuple[http.client.HTTPResponse, bool]:
    request = urllib.request.Request(url, headers={"User-Agent": "gpufleet-bundle"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # the partial file is already complete (or longer than the file)
            return _open(url, 0)
        raise
    return response, offset > 0 and response.status == 206


def download(ctx: BuildContext, url: str, dest: Path, sha256: str | None) -> bool:
    """Download ``url`` to ``dest`` (verified); resume a previous ``.part``. False when already present.

    ``sha256=None`` (an unpinned manifest entry) is refused unless the build trusts first downloads; then
    the digest is printed so it can be pinned in the manifest, and the lock records it.
    """
    if sha256 is None and not ctx.trust_first_download:
        raise BuildError(
            f"{url}: no sha256 pinned in the manifest. Fix: add it, or build once on a trusted "
            "network with --trust-first-download and copy the printed sha256 into the manifest."
        )
    if sha256 is not None and dest.is_file() and sha256_file(dest) == sha256:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    try:
        response, resumed = _open(url, offset)
    except (urllib.error.URLError, OSError) as exc:
        raise BuildError(
            f"{url}: download failed ({exc}). Fix: check the URL and the network; "
            "a rerun resumes where it stopped."
        ) from None
    with response, ctx.progress() as progress:
        length = response.headers.get("Content-Length")
        start = offset if resumed else 0
        task = progress.add_task(dest.name, total=(int(length) + start) if length else None, completed=start)
        with part.open("ab" if resumed else "wb") as out:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                progress.advance(task, len(chunk))
    os.replace(part, dest)
    if sha256 is None:
        ctx.console.print(f"[yellow]unpinned[/] {url}: sha256 {sha256_file(dest)} (pin it in the manifest)")
    else:
        _check_digest(dest, sha256, url)
    return True


def copy_file(ctx: BuildContext, source: Path, dest: Path, sha256: str | None) -> bool:
    """Copy a local file into the bundle (verified). False when the destination already matches."""
    if not source.is_file():
        raise BuildError(f"{source}: missing; expected a file on the build machine. Fix: correct the path.")
    expected = sha256 or sha256_file(source)
    if dest.is_file() and sha256_file(dest) == expected:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    shutil.copyfile(source, tmp)
    os.replace(tmp, dest)
    _check_digest(dest, expected, str(source))
    return True
