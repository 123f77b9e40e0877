"""Offline bundles: ``build`` fetches what a manifest pins and writes bundle.lock.yml; ``verify`` checks.

Each artifact becomes one or more files at the path docs/conventions.md fixes. An artifact whose files are
already in the previous lock with the same version and source, and still match it, is not fetched again.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from gpufleet.bundle.debian import describe, fetch_debian_binaries, fetch_debian_docker, fetch_debian_repo
from gpufleet.bundle.fetch import BuildContext, BuildError, copy_file, download, run
from gpufleet.bundle.images import image_contents, image_id, save_image
from gpufleet.bundle.lock import (
    LOCK_NAME,
    SIGNATURE_NAME,
    Lock,
    LockedFile,
    LockedImage,
    LockedModel,
    LockError,
    bundle_files,
    entries_intact,
    inside,
    lock_entry,
    read_lock,
    verify_bundle,
    write_lock,
)
from gpufleet.bundle.manifest import (
    DebianBinariesSource,
    DebianDockerSource,
    DebianRepoSource,
    DockerArchiveSource,
    DockerDaemonSource,
    FileSource,
    HttpSource,
    ImageArtifact,
    Manifest,
    ManifestError,
    ModelArtifact,
    PipSource,
    SkopeoSource,
    load_manifest,
)
from gpufleet.bundle.model import fetch_model, head_commit
from gpufleet.bundle.reproducible import unpinned
from gpufleet.bundle.selfwheel import build_wheel, describe_origin

__all__ = ["BuildError", "BuildResult", "LockError", "ManifestError", "build", "load_manifest", "verify"]


@dataclass
class BuildResult:
    lock: Lock
    fetched: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # What a rebuild from the same manifest and commit may not reproduce, one line each (nothing: all of it).
    unreproducible: list[str] = field(default_factory=list)
    unsigned: bool = False  # the build changed a signed lock and removed its signature


@dataclass(frozen=True)
class Unit:
    """One artifact to build: where it lands (a file or a directory), its lock version and source."""

    name: str
    path: str
    version: str
    source: str
    make: Callable[[BuildContext, Path], None]
    optional: bool = False


def _source_text(source: HttpSource | FileSource) -> str:
    return source.url if isinstance(source, HttpSource) else f"file:{source.path}"


def _get_file(source: HttpSource | FileSource) -> Callable[[BuildContext, Path], None]:
    def make(ctx: BuildContext, dest: Path) -> None:
        if isinstance(source, HttpSource):
            download(ctx, source.url, dest, source.sha256)
        else:
            copy_file(ctx, ctx.local(source.path), dest, source.sha256)

    return make


def _file_units(
    name: str, folder: str, version: str, files: list[HttpSource | FileSource], optional: bool
) -> Iterator[Unit]:
    for source in files:
        yield Unit(
            name, f"{folder}/{source.file_name()}", version, _source_text(source), _get_file(source), optional
        )


def _repo_unit(name: str, folder: str, version: str, repo: DebianRepoSource, optional: bool) -> Unit:
    def make(ctx: BuildContext, dest: Path) -> None:
        fetch_debian_repo(ctx, repo, dest)

    return Unit(name, folder, version, describe(repo.suites, repo.packages), make, optional)


def _docker_units(manifest: Manifest) -> Iterator[Unit]:
    docker = manifest.docker
    if docker is None:
        return
    source = docker.source
    if isinstance(source, DebianDockerSource):

        def make(ctx: BuildContext, dest: Path) -> None:
            fetch_debian_docker(ctx, source.mirror, source.suite, source.packages, dest)

        yield Unit(
            "docker", docker.bundle_path(), docker.version, describe(source.suite, source.packages), make
        )
    else:
        yield Unit("docker", docker.bundle_path(), docker.version, _source_text(source), _get_file(source))


def _monitoring_units(manifest: Manifest) -> Iterator[Unit]:
    if (monitoring := manifest.monitoring) is None:
        return
    for name, release in (("prometheus", monitoring.prometheus), ("node_exporter", monitoring.node_exporter)):
        path, source = release.bundle_path(name), release.source
        if isinstance(source, DebianBinariesSource):
            directory = f"{name}-{release.version}.linux-amd64"

            def make(
                ctx: BuildContext, dest: Path, source: DebianBinariesSource = source, top: str = directory
            ) -> None:
                fetch_debian_binaries(ctx, source, dest, directory=top)

            yield Unit(name, path, release.version, describe(source.suite, source.packages), make)
        else:
            yield Unit(name, path, release.version, _source_text(source), _get_file(source))


def _gateway_units(manifest: Manifest) -> Iterator[Unit]:
    if (gateway := manifest.gateway) is None:
        return
    router = gateway.router
    yield Unit(
        "router", router.bundle_path(), router.version, _source_text(router.source), _get_file(router.source)
    )
    if (edge := gateway.edge) is not None:  # roles/gateway reads it at gateway/edge
        yield _repo_unit("edge", "gateway/edge", edge.version, edge.repo, False)


def _nvidia_units(manifest: Manifest) -> Iterator[Unit]:
    if (toolkit := manifest.nvidia_container_toolkit) is not None:
        folder = f"nvidia_container_toolkit/{toolkit.version}"
        yield from _file_units(
            "nvidia_container_toolkit", folder, toolkit.version, toolkit.files, toolkit.optional
        )
        if toolkit.repo:
            yield _repo_unit(
                "nvidia_container_toolkit", folder, toolkit.version, toolkit.repo, toolkit.optional
            )
    if (driver := manifest.nvidia_driver) is not None:
        source = driver.source
        if isinstance(source, DebianRepoSource):
            yield _repo_unit("nvidia_driver", "nvidia_driver/repo", driver.version, source, driver.optional)
        else:
            path = f"nvidia_driver/NVIDIA-Linux-x86_64-{driver.version}.run"
            yield Unit(
                "nvidia_driver",
                path,
                driver.version,
                _source_text(source),
                _get_file(source),
                driver.optional,
            )
    if (cuda := manifest.cuda) is not None:
        folder = f"cuda/{cuda.version}"
        yield from _file_units("cuda", folder, cuda.version, cuda.files, cuda.optional)
        if cuda.repo:
            yield _repo_unit("cuda", f"{folder}/repo", cuda.version, cuda.repo, cuda.optional)


def _image_source_text(image: ImageArtifact) -> str:
    source = image.source
    if isinstance(source, DockerArchiveSource):
        return f"docker-archive:{source.path}"
    if isinstance(source, DockerDaemonSource):
        return f"docker-daemon:{image.reference}"
    if isinstance(source, SkopeoSource):
        return source.reference
    return describe(source.suite, {"busybox-static": source.package_version})


def _image_unit(image: ImageArtifact) -> Unit:
    def make(ctx: BuildContext, dest: Path) -> None:
        save_image(ctx, image, dest)

    return Unit(f"image {image.reference}", image.bundle_path(), image.tag, _image_source_text(image), make)


def _model_unit(model: ModelArtifact) -> Unit:
    def make(ctx: BuildContext, dest: Path) -> None:
        # A plain path (the lab's local remote) is relative to the manifest, as every local source is.
        url = model.url if "://" in model.url else ctx.local(model.url).resolve().as_uri()
        fetch_model(url, model.revision, dest, concurrency=model.source.lfs_concurrency)

    return Unit(f"model {model.repo}", model.bundle_path(), model.revision, model.url, make)


def _wheel_units(manifest: Manifest, notes: list[str]) -> Iterator[Unit]:
    wheels = manifest.wheels
    if wheels is None:
        return
    yield from _file_units("wheels", "wheels", "", wheels.files, False)
    if wheels.pip is not None:
        yield _pip_unit(wheels.pip, notes)


def _pip_unit(pip: PipSource, notes: list[str]) -> Unit:
    def make(ctx: BuildContext, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for version in pip.python_versions if pip.requirements else ():
            run(
                [
                    sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", version, "--implementation", "cp",
                    *(flag for platform in pip.platforms for flag in ("--platform", platform)),
                    "--dest", str(dest), *pip.requirements,
                ],
                what=f"wheels for Python {version}",
            )  # fmt: skip
        if pip.include_gpufleet:
            notes.extend(build_wheel(ctx.work, dest))

    pythons = ",".join(pip.python_versions)
    # The origin (a commit) is part of the source: a build from another commit does not reuse the wheel.
    self_wheel = f" + {describe_origin()}" if pip.include_gpufleet else ""
    source = f"pypi (cp{pythons} x86_64){self_wheel}: " + " ".join(sorted(pip.requirements))
    return Unit("wheels", "wheels", "", source, make)


def units(manifest: Manifest, notes: list[str] | None = None) -> list[Unit]:
    """Everything a manifest asks for, in a fixed order; ``notes`` gets what a fetch cannot reproduce."""
    notes = [] if notes is None else notes
    return [
        *_docker_units(manifest),
        *_nvidia_units(manifest),
        *(_image_unit(image) for image in manifest.images),
        *([_model_unit(manifest.model)] if manifest.model else []),
        *_monitoring_units(manifest),
        *_gateway_units(manifest),
        *_wheel_units(manifest, notes),
    ]


def _wheel_version(relpath: str) -> str:
    """A wheel's version from its file name (name-version-...whl)."""
    match = re.match(r"^[^-]+-([^-]+)-", Path(relpath).name)
    return match[1] if match else ""


def _entries_for(out: Path, unit: Unit) -> list[LockedFile]:
    target = out / unit.path
    if target.is_file():
        return [lock_entry(out, unit.path, unit.version, unit.source)]
    rels = [f"{unit.path}/{rel}" for rel in bundle_files(target)] if target.is_dir() else []
    return [lock_entry(out, rel, unit.version or _wheel_version(rel), unit.source) for rel in rels]


def _previous(out: Path, unit: Unit, old: Lock | None) -> list[LockedFile]:
    if old is None:
        return []
    prefix = unit.path + "/"
    entries = [
        e
        for e in old.files
        if (e.path == unit.path or e.path.startswith(prefix))
        and e.source == unit.source
        and (e.version == unit.version or not unit.version)
    ]
    return entries if entries_intact(out, entries) else []


def _build_unit(ctx: BuildContext, unit: Unit, old: Lock | None, result: BuildResult) -> list[LockedFile]:
    dest = inside(ctx.out, unit.path)  # nothing outside the bundle is ever written or deleted
    if reused := _previous(ctx.out, unit, old):
        result.reused.append(unit.name)
        return reused
    ctx.console.print(f"[bold]fetch[/] {unit.name} → {unit.path}")
    unit.make(ctx, dest)
    result.fetched.append(unit.name)
    return _entries_for(ctx.out, unit)


def _resolved(
    manifest: Manifest, out: Path, old: Lock | None = None
) -> tuple[list[LockedImage], list[LockedModel]]:
    previous = {(image.name, image.tag, image.id): image for image in (old.images if old else [])}
    images = []
    for image in manifest.images:
        found = image_id_of(out, image)
        known = previous.get((image.name, image.tag, found))
        contents = known.model_dump(include=set(CONTENTS)) if known else _contents_of(out, image)
        images.append(
            LockedImage(
                name=image.name,
                tag=image.tag,
                id=found,
                path=image.bundle_path(),
                compression=image.compression,
                **contents,
            )
        )
    models = [
        LockedModel(repo=m.repo, revision=head_commit(out / m.bundle_path()), path=m.bundle_path(), url=m.url)
        for m in ([manifest.model] if manifest.model else [])
    ]
    return images, models


CONTENTS = ("cuda", "vllm", "ray", "torch", "python")


def _contents_of(out: Path, image: ImageArtifact) -> dict[str, str | None]:
    """The image's CUDA requirement and Python packages (a zstd file is read through ``zstd -dc``)."""
    with _plain(out, image) as path:
        return image_contents(path)


def image_id_of(out: Path, image: ImageArtifact) -> str:
    """The image ID of a built image file (zstd files are read through ``zstd -dc``)."""
    with _plain(out, image) as path:
        return image_id(path)


@contextlib.contextmanager
def _plain(out: Path, image: ImageArtifact) -> Iterator[Path]:
    """The image file as tar reads it: as built, or decompressed to a scratch file for zstd."""
    path = out / image.bundle_path()
    if image.compression != "zstd":
        yield path
        return
    plain = out / ".work" / "id-probe.tar"
    plain.parent.mkdir(parents=True, exist_ok=True)
    run(["zstd", "-q", "-d", "-f", str(path), "-o", str(plain)], what=image.reference)
    try:
        yield plain
    finally:
        plain.unlink()


def build(
    manifest_path: Path,
    out: Path,
    *,
    include_optional: bool = False,
    trust_first_download: bool = False,
    console: Console | None = None,
) -> BuildResult:
    """Build (or complete) the bundle in ``out``; writes ``out/bundle.lock.yml``."""
    manifest = load_manifest(manifest_path)
    out.mkdir(parents=True, exist_ok=True)
    ctx = BuildContext(
        out=out,
        manifest_dir=manifest_path.resolve().parent,
        console=console or Console(stderr=True),
        trust_first_download=trust_first_download,
    )
    try:
        old: Lock | None = read_lock(out)
    except LockError:
        old = None
    result = BuildResult(lock=Lock(manifest=manifest.name, files=[]))
    result.unreproducible = unpinned(manifest, include_optional=include_optional)
    files: list[LockedFile] = []
    for unit in units(manifest, result.unreproducible):
        if unit.optional and not include_optional:
            result.skipped.append(unit.name)
            continue
        locked = {entry.path for entry in files}
        # A directory unit (wheels/ of pip) lists every file under it: one a file unit put there stays its.
        files += [entry for entry in _build_unit(ctx, unit, old, result) if entry.path not in locked]
    images, models = _resolved(manifest, out, old)
    result.lock = Lock(manifest=manifest.name, files=files, images=images, models=models)
    before = (out / LOCK_NAME).read_bytes() if (out / LOCK_NAME).is_file() else None
    write_lock(out, result.lock)
    if before != (out / LOCK_NAME).read_bytes() and (out / SIGNATURE_NAME).exists():
        (out / SIGNATURE_NAME).unlink()  # it signed the lock this build replaced: sign the new one again
        result.unsigned = True
    shutil.rmtree(ctx.work, ignore_errors=True)
    return result


def verify(bundle: Path) -> list[str]:
    """One line per missing, corrupt or extra file; an empty list means the bundle is intact."""
    return verify_bundle(bundle, read_lock(bundle))
