"""Real Docker static tarballs for the lab, built from Debian's packages.

Docker's official static tarball (``docker-<version>.tgz``) holds ``docker/<binary>``. Debian's
docker.io, docker-cli, containerd, runc and tini packages hold the same programs, so repackaging them in
that layout exercises the docker role's static-binary install path with real daemons: bookworm gives
20.10, trixie 26.1, at the suite's current versions. The download, the repack and the lock are gpufleet's
own (``gpufleet.bundle.debian``, the bundle builder's debian-docker source, and ``gpufleet.bundle.lock``).
Nothing but Debian's mirror is contacted (the one this machine's apt uses).

Debian's builds are linked dynamically where the official ones are static: bookworm's dockerd needs
libdevmapper (``runtime_library_debs`` fetches it for the lab host's suite) and trixie's binaries need
trixie's glibc, so 26.1 runs on trixie hosts only.

Built tarballs are cached under ``~/.cache/gpufleet/docker-tarballs/<suite>/``; delete that folder to
rebuild. Run as a script to build a bundle by hand (for ``molecule test -s docker``)::

    python tests/integration/docker_tarball.py --suite bookworm --bundle /tmp/b --runtime-libs bookworm
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.bundle.debian import Apt, build_docker_tarball
from gpufleet.bundle.fetch import BuildContext
from gpufleet.bundle.lock import Lock, LockError, lock_entry, read_lock, sha256_file, write_lock
from gpufleet.lab.system import cache_dir, file_lock

SUITES = ("bookworm", "trixie")
DEFAULT_MIRROR = "http://deb.debian.org/debian"

# The Debian packages that hold the programs of Docker's static tarball (trixie moved the CLI to docker-cli).
DOCKER_PACKAGES = {
    "bookworm": ("docker.io", "containerd", "runc", "tini"),
    "trixie": ("docker.io", "docker-cli", "containerd", "runc", "tini"),
}
# Libraries Debian's dynamically linked dockerd 20.10 needs that a minimal trixie host lacks (bookworm's
# systemd pulls them in; the official static binaries need none); they depend on each other.
RUNTIME_LIBRARY_PACKAGES = ("libdevmapper1.02.1", "dmsetup")
TEST_MANIFEST = "gpufleet tests (tests/integration/docker_tarball.py)"


@dataclass(frozen=True)
class DockerTarball:
    """A built ``docker-<version>.tgz`` and what the docker role needs to know about it."""

    path: Path
    version: str  # upstream version as ``dockerd --version`` reports it, e.g. "20.10.24"
    sha256: str
    suite: str


def cache_root() -> Path:
    """~/.cache/gpufleet/docker-tarballs (beside the lab's root file systems)."""
    return cache_dir().parent / "docker-tarballs"


def debian_mirror() -> str:
    """The Debian archive this machine's apt uses (deb822 ``URIs:`` or one-line ``deb`` sources)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        if not source.is_file() or source.suffix not in {".list", ".sources", ""}:
            continue
        for uri in re.findall(r"(?:^URIs:|^deb)\s+(?:\[[^\]]*\]\s+)?(\S+)", source.read_text(), re.MULTILINE):
            if uri.rstrip("/").endswith("/debian"):
                return str(uri.rstrip("/"))
    return DEFAULT_MIRROR


def apt_download(suite: str, packages: Iterable[str], dest: Path) -> list[Path]:
    """The current .debs of ``packages`` in ``suite`` (gpufleet's private-apt downloader), into ``dest``."""
    with tempfile.TemporaryDirectory(prefix=f"apt-{suite}-") as tmp:
        ctx = BuildContext(out=Path(tmp), manifest_dir=Path(tmp))
        apt = Apt(ctx, debian_mirror(), suite, ["main"])
        return apt.download(dict.fromkeys(packages, ""), dest, with_dependencies=False)


def upstream_version(debian_version: str) -> str:
    """``20.10.24+dfsg1-1+deb12u1+b6`` -> ``20.10.24`` (what ``dockerd --version`` starts with)."""
    match = re.match(r"(?:\d+:)?(\d+(?:\.\d+)+)", debian_version)
    if not match:
        raise ValueError(f"docker.io version {debian_version!r}: expected it to start with N.N[.N]")
    return match.group(1)


def _deb_version(deb: Path) -> str:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def build_tarball(suite: str) -> DockerTarball:
    """Return the cached tarball for ``suite``, building it from Debian's packages first if needed."""
    if suite not in SUITES:
        raise ValueError(f"suite {suite!r}: expected one of {', '.join(SUITES)}")
    folder = cache_root() / suite
    meta = folder / "tarball.json"
    with file_lock(folder.with_suffix(".lock")):
        if meta.is_file():
            recorded = json.loads(meta.read_text())
            tarball = DockerTarball(Path(recorded["path"]), recorded["version"], recorded["sha256"], suite)
            if tarball.path.is_file():
                return tarball
        with tempfile.TemporaryDirectory(prefix=f"docker-debs-{suite}-") as tmp:
            debs = apt_download(suite, DOCKER_PACKAGES[suite], Path(tmp))
            docker_io = next(deb for deb in debs if deb.name.startswith("docker.io_"))
            version = upstream_version(_deb_version(docker_io))
            path = folder / f"docker-{version}.tgz"
            build_docker_tarball(debs, path)  # the bundle builder's repack (its debian-docker source)
        tarball = DockerTarball(path, version, sha256_file(path), suite)
        meta.write_text(json.dumps({"path": str(path), "version": version, "sha256": tarball.sha256}))
        return tarball


def runtime_library_debs(suite: str) -> list[Path]:
    """The .debs of the libraries Debian's dockerd 20.10 links against, for a lab host of ``suite``."""
    folder = cache_root() / "runtime-libs" / suite
    with file_lock(folder.with_suffix(".lock")):
        found = {name: sorted(folder.glob(f"{name}_*.deb")) for name in RUNTIME_LIBRARY_PACKAGES}
        if all(found.values()):
            return [paths[-1] for paths in found.values()]
        return apt_download(suite, RUNTIME_LIBRARY_PACKAGES, folder)


def add_to_lock(bundle: Path, entries: dict[str, tuple[str, str]]) -> None:
    """Record bundle files (relative path -> (version, source)) in bundle.lock.yml, keeping other entries."""
    try:
        lock = read_lock(bundle)
    except LockError:  # no lock yet, or one an older helper wrote: start a new one
        lock = Lock(manifest=TEST_MANIFEST, files=[])
    files = lock.by_path()
    for relative, (version, source) in entries.items():
        files[relative] = lock_entry(bundle, relative, version, source)
    write_lock(bundle, lock.model_copy(update={"files": list(files.values())}))


def write_bundle(tarballs: Iterable[DockerTarball], bundle: Path) -> Path:
    """Lay ``tarballs`` out as an offline bundle (docs/conventions.md): docker/ plus bundle.lock.yml."""
    (bundle / "docker").mkdir(parents=True, exist_ok=True)
    entries = {}
    for tarball in tarballs:
        relative = f"docker/{tarball.path.name}"
        target = bundle / relative
        if not target.exists():
            try:
                os.link(tarball.path, target)
            except OSError:  # another file system than the cache
                shutil.copy2(tarball.path, target)
        entries[relative] = (tarball.version, f"debian:{tarball.suite} docker.io (test repack)")
    add_to_lock(bundle, entries)
    return bundle


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--suite", choices=SUITES, action="append", help="tarball to build (repeat; default: none)"
    )
    parser.add_argument("--bundle", type=Path, help="lay the tarballs out as an offline bundle here")
    parser.add_argument(
        "--runtime-libs", choices=SUITES, help="also fetch the runtime library .debs for this suite"
    )
    args = parser.parse_args()
    tarballs = [build_tarball(suite) for suite in args.suite or []]
    report: dict[str, object] = {
        "tarballs": [
            {"path": str(t.path), "version": t.version, "sha256": t.sha256, "suite": t.suite}
            for t in tarballs
        ]
    }
    if args.bundle:
        report["bundle"] = str(write_bundle(tarballs, args.bundle))
    if args.runtime_libs:
        report["runtime_libs"] = [str(path) for path in runtime_library_debs(args.runtime_libs)]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
