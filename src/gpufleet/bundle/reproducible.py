"""What a bundle build cannot promise to reproduce: manifest entries not pinned to exact bytes.

The same manifest and the same gpufleet commit give a byte-identical lock when every upstream artifact is the
same: files pinned by sha256, images by ID or digest, the model by commit, Debian packages by version. Where
the manifest leaves a choice to the day of the build, ``gpufleet bundle build`` names the entry, so a reviewer
knows which lines of a second build's lock may differ and why.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from gpufleet.bundle.manifest import (
    DebianBinariesSource,
    DebianDockerSource,
    DebianRepoSource,
    DockerDaemonSource,
    HttpSource,
    Manifest,
)

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _http(name: str, source: object) -> Iterator[str]:
    if isinstance(source, HttpSource) and source.sha256 is None:
        yield f"{name}: {source.url} has no sha256 in the manifest: the bundle takes what it serves that day"


def _debian(name: str, source: object) -> Iterator[str]:
    if not isinstance(source, DebianRepoSource | DebianDockerSource | DebianBinariesSource):
        return
    packages: Mapping[str, str] = source.packages
    if loose := sorted(package for package, version in packages.items() if not version):
        yield f"{name}: {', '.join(loose)} not pinned to a version: the candidate of debian:{source.suite}"
    if isinstance(source, DebianRepoSource) and source.with_dependencies:
        yield (
            f"{name}: the dependencies of {', '.join(sorted(packages))} are resolved from "
            f"debian:{source.suites} that day (a point release can change them)"
        )


def _sources(manifest: Manifest, include_optional: bool) -> Iterator[tuple[str, object]]:
    if manifest.docker is not None:
        yield "docker", manifest.docker.source
    for name in ("nvidia_container_toolkit", "cuda"):
        artifact = getattr(manifest, name)
        if artifact is None or (artifact.optional and not include_optional):
            continue
        yield from ((name, source) for source in artifact.files)
        if artifact.repo is not None:
            yield name, artifact.repo
    driver = manifest.nvidia_driver
    if driver is not None and (include_optional or not driver.optional):
        yield "nvidia_driver", driver.source
    if manifest.monitoring is not None:
        yield "prometheus", manifest.monitoring.prometheus.source
        yield "node_exporter", manifest.monitoring.node_exporter.source
    if manifest.wheels is not None:
        yield from (("wheels", source) for source in manifest.wheels.files)


def unpinned(manifest: Manifest, *, include_optional: bool = False) -> list[str]:
    """One line per entry whose bytes the manifest does not fix, so a rebuild may differ there."""
    lines: list[str] = []
    for name, source in _sources(manifest, include_optional):
        lines += [*_http(name, source), *_debian(name, source)]
    for image in manifest.images:
        if isinstance(image.source, DockerDaemonSource) and image.id is None:
            lines.append(
                f"image {image.reference}: saved from the local Docker daemon by tag without a pinned id: "
                "whatever the tag names that day"
            )
    if (model := manifest.model) is not None and not _COMMIT.match(model.revision):
        lines.append(
            f"model {model.repo}: revision {model.revision!r} is a branch or tag: the lock records the "
            "commit it named that day (pin the commit for a bundle that rebuilds the same)"
        )
    return lines
