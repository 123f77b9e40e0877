"""Bundle artifacts made from Debian packages: Docker's static-tarball layout and local apt repositories.

apt runs with a private state directory per suite (its own sources list and package lists), so building a
trixie repository on a bookworm machine neither needs nor touches the machine's own apt configuration.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpufleet.bundle.fetch import BuildContext, BuildError, run
from gpufleet.bundle.manifest import AptSource, DebianBinariesSource, DebianRepoSource

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Binaries of Docker's official static tarball (docker-<version>.tgz holds docker/<binary>).
DOCKER_BINARIES = (
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "docker",
    "docker-init",
    "docker-proxy",
    "dockerd",
    "runc",
)
# Docker's docker-init is tini, statically linked: Debian ships it as tini's /usr/bin/tini-static.
BINARY_ALIASES = {"tini-static": "docker-init"}
_FIXED_MTIME = 946684800  # 2000-01-01: tar members get a constant time so rebuilt tarballs are identical


def describe(suite: str, packages: Mapping[str, str]) -> str:
    """The lock's ``source`` for packages from Debian."""
    return f"debian:{suite} " + " ".join(f"{name}={version}" for name, version in sorted(packages.items()))


class Apt:
    """apt-get with a private configuration for one mirror + suite (and the sources in ``also``)."""

    def __init__(
        self,
        ctx: BuildContext,
        mirror: str,
        suite: str,
        components: list[str],
        status: Path | None = None,
        *,
        also: Sequence[AptSource] = (),
    ) -> None:
        """``status``: a dpkg status file of the target (default: empty, i.e. download for a bare system)."""
        suites = "+".join([suite, *(source.suite for source in also)])
        self.root = ctx.work / "apt" / suites
        self.what = f"debian:{suites}"
        (self.root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (self.root / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        status = status or self.root / "status"
        lines = [(mirror, suite, components), *((s.mirror, s.suite, s.components) for s in also)]
        (self.root / "sources.list").write_text(
            "".join(f"deb [signed-by={KEYRING}] {m} {s} {' '.join(c)}\n" for m, s, c in lines)
        )
        self.options = [
            f"-oDir::Etc::SourceList={self.root / 'sources.list'}",
            "-oDir::Etc::SourceParts=/nonexistent",
            f"-oDir::State::Lists={self.root / 'lists'}",
            f"-oDir::State::status={status}",
            f"-oDir::Cache={self.root / 'cache'}",
            f"-oDir::Cache::archives={self.root / 'archives'}",
            "-oAPT::Architecture=amd64",
            "-oAPT::Install-Recommends=false",
            "-oDebug::NoLocking=true",
        ]
        self._updated = False

    def update(self) -> None:
        if not self._updated:
            run(["apt-get", "-q", *self.options, "update"], what=self.what)
            self._updated = True

    def download(self, packages: Mapping[str, str], dest: Path, *, with_dependencies: bool) -> list[Path]:
        """Download packages (version "" = the candidate) and, if asked, what the target lacks for them."""
        self.update()
        pins = [f"{name}={version}" if version else name for name, version in sorted(packages.items())]
        dest.mkdir(parents=True, exist_ok=True)
        if with_dependencies:
            run(
                [
                    "apt-get",
                    "-q",
                    "-y",
                    *self.options,
                    f"-oDir::Cache::archives={dest}",
                    "install",
                    "--download-only",
                    *pins,
                ],
                what=self.what,
            )
            shutil.rmtree(dest / "partial", ignore_errors=True)
            (dest / "lock").unlink(missing_ok=True)
        else:
            run(["apt-get", "-q", *self.options, "download", *pins], what=self.what, cwd=dest)
        return sorted(dest.glob("*.deb"))


def _tar_member(name: str, data: bytes, mode: int) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, _FIXED_MTIME
    info.uname = info.gname = "root"
    return info, io.BytesIO(data)


def write_tgz(dest: Path, members: Mapping[str, bytes], *, directory: str) -> None:
    """A gzip tarball whose bytes depend only on ``members`` (sorted, fixed times and owners)."""
    tmp = dest.with_name(dest.name + ".part")
    with (
        tmp.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar,
    ):
        dir_info = tarfile.TarInfo(directory)
        dir_info.type, dir_info.mode, dir_info.mtime = tarfile.DIRTYPE, 0o755, _FIXED_MTIME
        tar.addfile(dir_info)
        for name in sorted(members):
            tar.addfile(*_tar_member(f"{directory}/{name}", members[name], 0o755))
    os.replace(tmp, dest)


def find_binaries(tree: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    """Executables named ``names`` in a bin, sbin or libexec directory below ``tree``, first match wins.

    docker.io also ships /etc/default/docker (a shell fragment) and /etc/init.d/docker (an executable
    init script); both sort before usr/bin/docker and would otherwise become the tarball's docker CLI.
    """
    found: dict[str, bytes] = {}
    for path in sorted(tree.rglob("*")):
        name = BINARY_ALIASES.get(path.name, path.name)
        if name not in names or name in found or not path.is_file() or path.is_symlink():
            continue
        in_bin = {"bin", "sbin", "libexec"} & set(path.relative_to(tree).parts[:-1])
        if in_bin and path.stat().st_mode & 0o111:
            found[name] = path.read_bytes()
    return found


def build_docker_tarball(debs: list[Path], dest: Path) -> None:
    """Repackage Debian's docker.io/containerd/runc .debs into Docker's static tarball layout."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-docker-") as tmp:
        for deb in debs:
            run(["dpkg-deb", "-x", str(deb), tmp], what=deb.name)
        binaries = find_binaries(Path(tmp), DOCKER_BINARIES)
    missing = sorted(set(DOCKER_BINARIES) - binaries.keys())
    if missing:
        raise BuildError(
            f"{dest.name}: the .debs lack {', '.join(missing)}. "
            "Fix: list docker.io, containerd and runc (and tini for docker-init) in packages."
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_tgz(dest, binaries, directory="docker")


def fetch_debian_docker(
    ctx: BuildContext, mirror: str, suite: str, packages: Mapping[str, str], dest: Path
) -> None:
    """debian-docker source kind: download the pinned .debs and write docker/docker-<version>.tgz."""
    apt = Apt(ctx, mirror, suite, ["main"])
    with tempfile.TemporaryDirectory(prefix="gpufleet-debs-", dir=ctx.work) as tmp:
        debs = apt.download(packages, Path(tmp), with_dependencies=False)
        build_docker_tarball(debs, dest)


def fetch_debian_binaries(
    ctx: BuildContext, source: DebianBinariesSource, dest: Path, *, directory: str
) -> None:
    """debian-binaries source kind: the pinned .debs' binaries as a release tarball (``directory``/<name>)."""
    apt = Apt(ctx, source.mirror, source.suite, ["main"])
    with tempfile.TemporaryDirectory(prefix="gpufleet-debs-", dir=ctx.work) as tmp:
        debs = apt.download(source.packages, Path(tmp) / "debs", with_dependencies=False)
        tree = Path(tmp) / "tree"
        for deb in debs:
            run(["dpkg-deb", "-x", str(deb), str(tree)], what=deb.name)
        members: dict[str, bytes] = {}
        for name, member in sorted(source.binaries.items()):
            path = tree / member
            if not path.is_file():
                raise BuildError(
                    f"{dest.name}: the .debs ({', '.join(sorted(source.packages))}) have no {member}. "
                    "Fix: correct binaries in the manifest or pin a package version that ships it."
                )
            members[name] = path.read_bytes()
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_tgz(dest, members, directory=directory)


def write_packages_index(repo: Path) -> None:
    """A flat apt repository: ``deb [trusted=yes] file:/path ./`` reads Packages(.gz) beside the .debs."""
    index = run(["dpkg-scanpackages", "--multiversion", "."], what=str(repo), cwd=repo)
    (repo / "Packages").write_text(index)
    with (repo / "Packages").open("rb") as src, gzip.GzipFile(repo / "Packages.gz", "wb", mtime=0) as out:
        shutil.copyfileobj(src, out)


def fetch_debian_repo(ctx: BuildContext, source: DebianRepoSource, dest: Path) -> None:
    """debian-repo source kind: pinned packages (+ dependencies) and a Packages index in ``dest``."""
    apt = Apt(ctx, source.mirror, source.suite, source.components, also=source.also)
    apt.download(source.packages, dest, with_dependencies=source.with_dependencies)
    write_packages_index(dest)


def extract_from_deb(deb: Path, member: str) -> bytes:
    """One file out of a .deb (e.g. bin/busybox out of busybox-static)."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-deb-") as tmp:
        run(["dpkg-deb", "-x", str(deb), tmp], what=deb.name)
        path = Path(tmp, member)
        if not path.is_file():
            raise BuildError(f"{deb.name}: has no {member}. Fix: pin a package version that ships it.")
        return path.read_bytes()
