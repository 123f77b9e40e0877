"""The offline bundle manifest (offline_bundle/manifest.yml): what a bundle holds, every entry pinned.

Each artifact has a *slot* (docker, images, model, ...) that fixes where it lands in the bundle (the layout
in docs/conventions.md) and a *source* whose ``kind`` says how ``gpufleet bundle build`` gets it.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from gpufleet.problems import Problem

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
ImageId = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
Version = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+~:_-]*$")]
FileName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+~_-]*$")]
MODELSCOPE_URL = "https://www.modelscope.cn/{repo}.git"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- sources -------------------------------------------------------------------------------------------
class HttpSource(_Model):
    """A file downloaded over HTTP(S), resumed with Range requests, verified by sha256."""

    kind: Literal["http"]
    url: Annotated[str, StringConstraints(pattern=r"^https?://\S+$")]
    # None = not pinned yet: `bundle build` refuses unless --trust-first-download (then the lock pins it).
    sha256: Sha256 | None
    filename: FileName | None = None

    def file_name(self) -> str:
        return self.filename or self.url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]


class FileSource(_Model):
    """A file already on the build machine (relative paths are relative to the manifest)."""

    kind: Literal["file"]
    path: str
    sha256: Sha256
    filename: FileName | None = None

    def file_name(self) -> str:
        return self.filename or PurePosixPath(self.path).name


class DebianDockerSource(_Model):
    """Docker's static-tarball layout (docker/<binary>) repackaged from Debian's .debs, pinned by version."""

    kind: Literal["debian-docker"]
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    packages: dict[str, Version] = Field(min_length=1)


class DebianBinariesSource(_Model):
    """A release tarball's layout (<name>-<version>.linux-amd64/<binary>) repackaged from Debian's .debs.

    ``binaries`` maps each name in the tarball to its path inside the .debs (e.g. node_exporter:
    usr/bin/prometheus-node-exporter), so the role installs the same layout as the upstream release.
    """

    kind: Literal["debian-binaries"]
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    packages: dict[str, Version] = Field(min_length=1)
    binaries: dict[FileName, Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./+-]+$")]] = Field(
        min_length=1
    )


class AptSource(_Model):
    """One more apt source read together with a Debian source's own mirror and suite."""

    mirror: str
    suite: str
    components: list[str] = Field(default_factory=lambda: ["main"])


class DebianRepoSource(_Model):
    """A local apt repository (Packages index + .debs) of pinned packages and their dependencies.

    ``also``: more sources apt reads with ``mirror``/``suite``, e.g. the security suite, where a package's
    security fix is published (HAProxy 2.6.12-1+deb12u4 is in bookworm-security only).
    """

    kind: Literal["debian-repo"]
    suite: str = "bookworm"
    components: list[str] = Field(default_factory=lambda: ["main"])
    mirror: str = "http://deb.debian.org/debian"
    also: list[AptSource] = Field(default_factory=list)
    packages: dict[str, Version] = Field(min_length=1)
    with_dependencies: bool = True

    @property
    def suites(self) -> str:
        """Every suite apt reads, joined with + (the lock's source says them all)."""
        return "+".join([self.suite, *(source.suite for source in self.also)])


class DockerArchiveSource(_Model):
    """An existing ``docker save`` tarball on the build machine."""

    kind: Literal["docker-archive"]
    path: str
    sha256: Sha256


class DockerDaemonSource(_Model):
    """``docker save`` through a reachable daemon (the image must already be there)."""

    kind: Literal["docker-daemon"]
    docker_host: str | None = None


class SkopeoSource(_Model):
    """``skopeo copy`` from a registry, pinned by digest."""

    kind: Literal["skopeo"]
    reference: Annotated[str, StringConstraints(pattern=r"^docker://\S+@sha256:[0-9a-f]{64}$")]


class BusyboxImageSource(_Model):
    """Lab image: busybox-static from a pinned Debian .deb as a one-layer docker-archive written by Python."""

    kind: Literal["busybox-image"]
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    package_version: Version


class GitLfsSource(_Model):
    """A git-lfs repository (ModelScope by default); the revision is pinned on the model entry."""

    kind: Literal["git-lfs"]
    url: str | None = None
    lfs_concurrency: int = Field(default=64, ge=1, le=256)


class PipSource(_Model):
    """A control node's wheelhouse: gpufleet's own wheel plus the pinned wheels of its dependencies.

    ``pip download`` (binary only, no dependency resolution: every dependency is listed, pinned) once per
    Python version, so that ``pip install --no-index --find-links BUNDLE/wheels gpufleet`` works on a
    control node with any of them. pip matches each platform tag exactly, so several are listed.
    """

    kind: Literal["pip"]
    requirements: list[
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+(\[[a-z0-9,_-]+\])?==\S+$")]
    ]
    python_versions: list[Annotated[str, StringConstraints(pattern=r"^3\.\d+$")]] = Field(
        default_factory=lambda: ["3.11", "3.12"], min_length=1
    )
    platforms: list[str] = Field(
        default_factory=lambda: (
            [f"manylinux_2_{n}_x86_64" for n in (17, 27, 28, 31, 34)] + ["manylinux2014_x86_64"]
        ),
        min_length=1,
    )
    include_gpufleet: bool = True  # gpufleet's own wheel: built from the checkout, else from the index


FileSources = Annotated[HttpSource | FileSource, Field(discriminator="kind")]


# ---- artifacts -----------------------------------------------------------------------------------------
class DockerArtifact(_Model):
    version: Version
    source: Annotated[HttpSource | FileSource | DebianDockerSource, Field(discriminator="kind")]

    def bundle_path(self) -> str:
        return f"docker/docker-{self.version}.tgz"


class PackagesArtifact(_Model):
    """nvidia_container_toolkit: .deb/.rpm files of one version."""

    version: Version
    files: list[FileSources] = Field(default_factory=list)
    repo: DebianRepoSource | None = None
    optional: bool = False

    @model_validator(mode="after")
    def _files_or_repo(self) -> PackagesArtifact:
        # Both land in nvidia_container_toolkit/<version>/: a repository's index would list the files too.
        if self.files and self.repo:
            raise ValueError("give files or repo, not both")
        return self


class DriverArtifact(_Model):
    version: Version
    source: Annotated[HttpSource | FileSource | DebianRepoSource, Field(discriminator="kind")]
    optional: bool = False


class CudaArtifact(_Model):
    version: Version
    files: list[FileSources] = Field(default_factory=list)
    repo: DebianRepoSource | None = None
    optional: bool = False


class ImageArtifact(_Model):
    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._/-]*$")]
    tag: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")]
    id: ImageId | None = None
    compression: Literal["none", "gzip", "zstd"] = "none"
    source: Annotated[
        DockerArchiveSource | DockerDaemonSource | SkopeoSource | BusyboxImageSource,
        Field(discriminator="kind"),
    ]

    @property
    def reference(self) -> str:
        return f"{self.name}:{self.tag}"

    def bundle_path(self) -> str:
        suffix = {"none": "", "gzip": ".gz", "zstd": ".zst"}[self.compression]
        return f"images/{self.name.replace('/', '-')}_{self.tag}.tar{suffix}"


REPO_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"


class ModelArtifact(_Model):
    # Each part starts with a letter, digit or "_": "../.." (bundle_path models/../..) is no repository.
    repo: Annotated[
        str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    ]
    # A commit pins exactly; a branch or tag is resolved at build time and the lock records the commit.
    revision: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]
    source: GitLfsSource

    @property
    def url(self) -> str:
        return self.source.url or MODELSCOPE_URL.format(repo=self.repo)

    def bundle_path(self) -> str:
        return f"models/{self.repo}"


class ReleaseArtifact(_Model):
    """A monitoring program as its release tarball (<name>-<version>.linux-amd64.tar.gz, one directory)."""

    version: Version
    source: Annotated[HttpSource | FileSource | DebianBinariesSource, Field(discriminator="kind")]

    def bundle_path(self, name: str) -> str:
        return f"monitoring/{name}-{self.version}.linux-amd64.tar.gz"


class MonitoringArtifacts(_Model):
    """Prometheus (with promtool) for the head and node_exporter for every node; Grafana and dcgm-exporter
    are container images (the images: list)."""

    prometheus: ReleaseArtifact
    node_exporter: ReleaseArtifact


class RouterArtifact(_Model):
    """vllm-router's wheel for the gateway host (roles/gateway runs its files with the host's Python)."""

    version: Version
    source: FileSources

    def bundle_path(self) -> str:
        return f"gateway/{self.source.file_name()}"


class EdgeArtifact(_Model):
    """The gateway's edge: Debian's HAProxy and what it needs, as a local apt repository (gateway/edge)."""

    version: Version
    repo: DebianRepoSource


class GatewayArtifacts(_Model):
    router: RouterArtifact
    edge: EdgeArtifact | None = None


class WheelsArtifact(_Model):
    pip: PipSource | None = None
    files: list[FileSources] = Field(default_factory=list)


class Manifest(_Model):
    schema_version: Literal[1]
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    docker: DockerArtifact | None = None
    nvidia_container_toolkit: PackagesArtifact | None = None
    nvidia_driver: DriverArtifact | None = None
    cuda: CudaArtifact | None = None
    images: list[ImageArtifact] = Field(default_factory=list)
    model: ModelArtifact | None = None
    monitoring: MonitoringArtifacts | None = None
    gateway: GatewayArtifacts | None = None
    wheels: WheelsArtifact | None = None

    @field_validator("images")
    @classmethod
    def _unique_images(cls, images: list[ImageArtifact]) -> list[ImageArtifact]:
        seen = [image.bundle_path() for image in images]
        duplicates = sorted({path for path in seen if seen.count(path) > 1})
        if duplicates:
            raise ValueError(f"two images land in the same file {duplicates}")
        return images


class ManifestError(Exception):
    """A manifest gpufleet cannot use; ``problems`` holds one line each."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(problem) for problem in problems))


_FIXES = {
    "extra_forbidden": "remove the key or correct its spelling (see offline_bundle/README.md)",
    "missing": "add the key",
    "string_pattern_mismatch": "use the form the pattern shows",
    "literal_error": "use one of the allowed values",
    "union_tag_invalid": "set source.kind to one of the kinds listed",
}


def _problems_from(path: Path, error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        key = re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", key)
        found = "nothing" if item["type"] == "missing" else repr(item.get("input"))[:80]
        fix = _FIXES.get(item["type"], "correct the value")
        problems.append(Problem(str(path), key, found, item["msg"].lower(), fix))
    return problems


def parse_manifest(data: Any, path: Path) -> Manifest:
    """Validate already-loaded YAML data; raises ManifestError naming file, key and fix."""
    if not isinstance(data, dict):
        raise ManifestError(
            [
                Problem(
                    str(path),
                    "(top level)",
                    type(data).__name__,
                    "a mapping",
                    "start from offline_bundle/manifest.yml",
                )
            ]
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(_problems_from(path, exc)) from None


def load_manifest(path: Path) -> Manifest:
    """Read and validate a manifest file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ManifestError(
            [
                Problem(
                    str(path),
                    "(file)",
                    f"bytes that are not UTF-8 at offset {exc.start}",
                    "UTF-8 YAML text",
                    "save the manifest as UTF-8 text",
                )
            ]
        ) from None
    except OSError as exc:
        raise ManifestError(
            [
                Problem(
                    str(path),
                    "(file)",
                    exc.strerror or "unreadable",
                    "a readable file",
                    "pass --manifest with an existing file",
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        raise ManifestError(
            [Problem(str(path), "(syntax)", str(exc).splitlines()[0], "valid YAML", "fix the YAML syntax")]
        ) from None
    return parse_manifest(data, path)
