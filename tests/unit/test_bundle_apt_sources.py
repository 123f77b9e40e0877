"""A debian-repo source may read more apt sources than its own mirror and suite (``also``): HAProxy's fix for
Debian 12 (2.6.12-1+deb12u4) is published in bookworm-security only, and apt read one suite per source."""

from __future__ import annotations

from pathlib import Path

from gpufleet.bundle.build import _repo_unit
from gpufleet.bundle.debian import Apt
from gpufleet.bundle.fetch import BuildContext
from gpufleet.bundle.manifest import DebianRepoSource

SECURITY = {"mirror": "http://deb.debian.org/debian-security", "suite": "bookworm-security"}


def edge_repo(**more: object) -> DebianRepoSource:
    return DebianRepoSource.model_validate(
        {"kind": "debian-repo", "packages": {"haproxy": "2.6.12-1+deb12u4"}, "also": [SECURITY], **more}
    )


def test_apt_reads_the_suite_and_every_source_in_also(tmp_path: Path) -> None:
    source = edge_repo()
    ctx = BuildContext(out=tmp_path, manifest_dir=tmp_path)
    apt = Apt(ctx, source.mirror, source.suite, source.components, also=source.also)

    keyring = "signed-by=/usr/share/keyrings/debian-archive-keyring.gpg"
    assert (apt.root / "sources.list").read_text().splitlines() == [
        f"deb [{keyring}] http://deb.debian.org/debian bookworm main",
        f"deb [{keyring}] http://deb.debian.org/debian-security bookworm-security main",
    ]
    assert apt.root.name == "bookworm+bookworm-security" and apt.what == "debian:bookworm+bookworm-security"


def test_the_lock_names_every_suite_the_packages_came_from() -> None:
    unit = _repo_unit("gateway_edge", "gateway/edge", "2.6.12", edge_repo(), False)
    assert unit.source == "debian:bookworm+bookworm-security haproxy=2.6.12-1+deb12u4"
    alone = DebianRepoSource.model_validate(
        {"kind": "debian-repo", "packages": {"haproxy": "2.6.12-1+deb12u4"}}
    )
    assert (alone.also, alone.suites) == ([], "bookworm")
