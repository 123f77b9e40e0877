"""`gpufleet bundle diff OLD NEW` (issue 40): what changed between two locks, to review an upgrade bundle."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.bundle.lock import Lock, LockedFile, LockedModel, write_lock
from gpufleet.cli import main

OLD_SOURCE = "pypi (cp3.11 x86_64) + gpufleet 0.1.0 from commit aaaa: pydantic==2.14.3"
NEW_SOURCE = "pypi (cp3.11 x86_64) + gpufleet 0.1.0 from commit bbbb: pydantic==2.15.0"


def entry(path: str, version: str, digest: str, source: str = "t", size: int = 10) -> LockedFile:
    return LockedFile(path=path, size=size, sha256=digest * 64, version=version, source=source)


def lock_in(folder: Path, files: list[LockedFile], revision: str) -> Path:
    folder.mkdir()
    model = LockedModel(repo="org/m", revision=revision, path="models/org/m", url="https://x/org/m.git")
    write_lock(folder, Lock(manifest="prod", files=files, models=[model]))
    return folder


@pytest.fixture
def upgrade(tmp_path: Path) -> tuple[Path, Path]:
    """pydantic 2.14.3 -> 2.15.0, the docker tarball unchanged, a wheel added, the model at a new commit."""
    docker = entry("docker/docker-27.5.1.tgz", "27.5.1", "d")
    pydantic = "wheels/pydantic-{}-cp311-cp311-manylinux_2_17_x86_64.whl"
    rich = "wheels/rich-15.0.0-py3-none-any.whl"
    before = [
        docker,
        entry(pydantic.format("2.14.3"), "2.14.3", "a", OLD_SOURCE),
        entry(rich, "15.0.0", "c", OLD_SOURCE),
    ]
    after = [
        docker,
        entry(pydantic.format("2.15.0"), "2.15.0", "b", NEW_SOURCE, 12),
        entry(rich, "15.0.0", "c", NEW_SOURCE),
        entry("wheels/mdurl-0.1.2-py3-none-any.whl", "0.1.2", "e", NEW_SOURCE),
    ]
    old = lock_in(tmp_path / "old", before, "1" * 40)
    new = lock_in(tmp_path / "new", after, "2" * 40)
    return old, new


def test_a_version_bump_reads_as_one_change(
    upgrade: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = upgrade
    assert main(["bundle", "diff", str(old), str(new / "bundle.lock.yml")]) == 0  # a directory or a lock file
    assert capsys.readouterr().out.splitlines() == [
        "added wheels/mdurl-0.1.2-py3-none-any.whl (version 0.1.2, 10 bytes, sha256 eeeeeeeeeeee)",
        "changed wheels/pydantic-2.14.3-cp311-cp311-manylinux_2_17_x86_64.whl -> "
        "wheels/pydantic-2.15.0-cp311-cp311-manylinux_2_17_x86_64.whl: version 2.14.3 -> 2.15.0; "
        "sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb; size 10 -> 12",
        f"source of 1 unchanged file(s): {OLD_SOURCE!r} -> {NEW_SOURCE!r}",
        f"changed model org/m: revision {'1' * 40} -> {'2' * 40}",
    ]


def test_the_same_lock_has_no_change(upgrade: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    old, _ = upgrade
    assert main(["bundle", "diff", str(old), str(old)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == "no change"


def test_a_missing_lock_is_refused_with_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bundle", "diff", str(tmp_path), str(tmp_path)]) == 2
    assert (
        "bundle.lock.yml: missing; expected the lock written by `gpufleet bundle build`"
        in capsys.readouterr().err
    )
