"""Real Docker static tarballs for the lab, built from Debian's packages.

Docker's official static tarball (``docker-<version>.tgz``) holds ``docker/<binary>``. Debian's
docker.io, docker-cli, containerd, runc and tini packages hold the same programs, so repackaging them in
that layout exercises the docker role's static-binary install path with real daemons: bookworm gives
20.10, trixie 26.1. Nothing but Debian's mirror is contacted (the one this machine's apt already uses).

Debian's builds are linked dynamically where the official ones are static: bookworm's dockerd needs
libdevmapper (``runtime_library_debs`` fetches it for the lab host's suite) and trixie's binaries need
trixie's glibc, so 26.1 runs on trixie hosts only.

Built tarballs are cached under ``~/.cache/gpufleet/docker-tarballs/<suite>/``; delete that folder to
rebuild. Run as a script to build a bundle by hand (for ``molecule test -s docker``)::

    python tests/integration/docker_tarball.py --suite bookworm --bundle /tmp/b --runtime-libs bookworm
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

SUITES = ("bookworm", "trixie")
DEFAULT_MIRROR = "http://deb.debian.org/debian"

# Where each binary of the official tarball comes from: (Debian package, path inside the package).
BINARY_SOURCES: dict[str, dict[str, tuple[str, str]]] = {
    "bookworm": {
        "dockerd": ("docker.io", "usr/sbin/dockerd"),
        "docker-proxy": ("docker.io", "usr/sbin/docker-proxy"),
        "docker": ("docker.io", "usr/bin/docker"),
    },
    "trixie": {
        "dockerd": ("docker.io", "usr/sbin/dockerd"),
        "docker-proxy": ("docker.io", "usr/sbin/docker-proxy"),
        "docker": ("docker-cli", "usr/bin/docker"),
    },
}
COMMON_SOURCES: dict[str, tuple[str, str]] = {
    "containerd": ("containerd", "usr/bin/containerd"),
    "containerd-shim-runc-v2": ("containerd", "usr/bin/containerd-shim-runc-v2"),
    "ctr": ("containerd", "usr/bin/ctr"),
    "runc": ("runc", "usr/sbin/runc"),
    "docker-init": ("tini", "usr/bin/tini-static"),  # Docker's docker-init is tini, statically linked
}
# Libraries Debian's dynamically linked dockerd 20.10 needs that a minimal host lacks (the official
# static binaries need none); dmsetup and libdevmapper depend on each other, so both are installed.
RUNTIME_LIBRARY_PACKAGES = ("libdevmapper1.02.1", "dmsetup")


@dataclass(frozen=True)
class DockerTarball:
    """A built ``docker-<version>.tgz`` and what the docker role needs to know about it."""

    path: Path
    version: str  # upstream version as ``dockerd --version`` reports it, e.g. "20.10.24"
    sha256: str
    suite: str


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpufleet" / "docker-tarballs"


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


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _apt_config(suite: str, workdir: Path) -> dict[str, str]:
    """Environment for an apt that sees only ``suite`` of this machine's Debian mirror, state in workdir."""
    for sub in (
        "etc/sources.list.d",
        "etc/preferences.d",
        "etc/apt.conf.d",
        "lists/partial",
        "cache/archives/partial",
    ):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    (workdir / "status").touch()
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    (workdir / "etc/sources.list").write_text(f"deb [signed-by={keyring}] {debian_mirror()} {suite} main\n")
    (workdir / "apt.conf").write_text(
        f'Dir::Etc "{workdir}/etc";\n'
        f'Dir::Etc::sourcelist "{workdir}/etc/sources.list";\n'
        f'Dir::Etc::sourceparts "{workdir}/etc/sources.list.d";\n'
        f'Dir::State::lists "{workdir}/lists";\n'
        f'Dir::State::status "{workdir}/status";\n'
        f'Dir::Cache "{workdir}/cache";\n'
        'APT::Architecture "amd64";\n'
        'APT::Sandbox::User "root";\n'
    )
    return {**os.environ, "APT_CONFIG": str(workdir / "apt.conf")}


def apt_download(suite: str, packages: Iterable[str], dest: Path) -> dict[str, Path]:
    """Download ``packages`` of ``suite`` into ``dest``; returns package name -> .deb path."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"apt-{suite}-") as tmp:
        env = _apt_config(suite, Path(tmp))
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, capture_output=True, timeout=300)
        names = sorted(set(packages))
        subprocess.run(["apt-get", "download", "-qq", *names], env=env, cwd=dest, check=True, timeout=600)
    return {name: next(dest.glob(f"{name}_*.deb")) for name in names}


def _deb_version(deb: Path) -> str:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def upstream_version(debian_version: str) -> str:
    """``20.10.24+dfsg1-1+deb12u1+b6`` -> ``20.10.24`` (what ``dockerd --version`` starts with)."""
    match = re.match(r"(?:\d+:)?(\d+(?:\.\d+)+)", debian_version)
    if not match:
        raise ValueError(f"docker.io version {debian_version!r}: expected it to start with N.N[.N]")
    return match.group(1)


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Same bytes for the same inputs: no owner names, no build-time mtimes.
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def _write_tarball(sources: dict[str, Path], dest: Path) -> None:
    """Write ``dest`` in the official layout: a ``docker/`` folder of executables, gzip-compressed."""
    partial = dest.with_suffix(".partial")
    with (
        partial.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        folder = tarfile.TarInfo("docker")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(_normalise(folder))
        for name in sorted(sources):
            info = _normalise(tar.gettarinfo(str(sources[name]), arcname=f"docker/{name}"))
            info.mode = 0o755
            with sources[name].open("rb") as handle:
                tar.addfile(info, handle)
    partial.rename(dest)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
        sources = {**BINARY_SOURCES[suite], **COMMON_SOURCES}
        with tempfile.TemporaryDirectory(prefix=f"docker-tarball-{suite}-") as tmp:
            debs = apt_download(suite, {pkg for pkg, _ in sources.values()}, Path(tmp) / "debs")
            tree = Path(tmp) / "tree"
            for deb in debs.values():
                subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
            version = upstream_version(_deb_version(debs["docker.io"]))
            binaries = {name: tree / inner for name, (_, inner) in sources.items()}
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"docker-{version}.tgz"
            _write_tarball(binaries, path)
        tarball = DockerTarball(path, version, sha256_of(path), suite)
        meta.write_text(json.dumps({"path": str(path), "version": version, "sha256": tarball.sha256}))
        return tarball


def runtime_library_debs(suite: str) -> list[Path]:
    """The .debs of the libraries Debian's dockerd 20.10 links against, for a lab host of ``suite``."""
    folder = cache_root() / "runtime-libs" / suite
    with file_lock(folder.with_suffix(".lock")):
        found = {name: sorted(folder.glob(f"{name}_*.deb")) for name in RUNTIME_LIBRARY_PACKAGES}
        if all(found.values()):
            return [paths[-1] for paths in found.values()]
        return list(apt_download(suite, RUNTIME_LIBRARY_PACKAGES, folder).values())


def write_bundle(tarballs: Iterable[DockerTarball], bundle: Path) -> Path:
    """Lay ``tarballs`` out as an offline bundle (docs/conventions.md): docker/ plus bundle.lock.yml.

    Entries of bundle.lock.yml for other files (another helper's) are kept; those of these tarballs replaced.
    """
    (bundle / "docker").mkdir(parents=True, exist_ok=True)
    lock_path = bundle / "bundle.lock.yml"
    entries = {entry["path"]: entry for entry in lock_files(lock_path)}
    for tarball in tarballs:
        relative = f"docker/{tarball.path.name}"
        target = bundle / relative
        if not target.exists():
            try:
                os.link(tarball.path, target)
            except OSError:  # another file system than the cache
                shutil.copy2(tarball.path, target)
        entries[relative] = {
            "path": relative,
            "size": target.stat().st_size,
            "sha256": tarball.sha256,
            "version": tarball.version,
            "source": f"Debian {tarball.suite} docker.io, containerd, runc, tini (gpufleet test repack)",
        }
    lock_path.write_text(yaml.safe_dump({"files": list(entries.values())}, sort_keys=False))
    return bundle


def lock_files(lock_path: Path) -> list[dict[str, object]]:
    lock = yaml.safe_load(lock_path.read_text()) if lock_path.is_file() else None
    return list((lock or {}).get("files") or [])


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
