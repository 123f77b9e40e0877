"""Reproducible bundles (issue 40): the same manifest and gpufleet commit give a byte-identical lock and
byte-identical files of our own. Before, gpufleet's own wheel got a new sha256 on every build (the zip times
of its generated dist-info files); now it is built from a scratch copy of the source tree with normalised
modes and SOURCE_DATE_EPOCH from the commit, and what the manifest leaves open is named by the build."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from gpufleet.bundle import build, load_manifest
from gpufleet.bundle.lock import LOCK_NAME, SIGNATURE_NAME
from gpufleet.bundle.reproducible import unpinned
from gpufleet.bundle.selfwheel import ZIP_EPOCH, copy_tree, source_tree
from gpufleet.cli import main

GIT_IDENTITY = ["-c", "user.name=t", "-c", "user.email=t@example.org"]


def wheels_only(folder: Path) -> Path:
    """gpufleet's own wheel and nothing to download (no requirements): no network but the build backend."""
    manifest = folder / "manifest.yml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "schema_version": 1,
                "name": "wheels-only",
                "wheels": {"pip": {"kind": "pip", "requirements": [], "python_versions": ["3.11"]}},
            }
        )
    )
    return manifest


@pytest.mark.slow
def test_two_builds_of_the_same_manifest_and_commit_are_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = wheels_only(tmp_path)
    assert main(["bundle", "build", "--manifest", str(manifest), "--out", str(tmp_path / "one")]) == 0
    build(manifest, tmp_path / "second build")  # another path: no build path may enter a file
    one, two = tmp_path / "one", tmp_path / "second build"
    assert (one / LOCK_NAME).read_bytes() == (two / LOCK_NAME).read_bytes()
    wheels = sorted(path.name for path in (one / "wheels").iterdir())
    assert len(wheels) == 1 and wheels[0].startswith("gpufleet-"), wheels
    assert (one / "wheels" / wheels[0]).read_bytes() == (two / "wheels" / wheels[0]).read_bytes()
    assert str(tmp_path).encode() not in (one / "wheels" / wheels[0]).read_bytes()
    with zipfile.ZipFile(one / "wheels" / wheels[0]) as wheel:
        modes = {info.external_attr >> 16 & 0o777 for info in wheel.infolist()}
        times = {info.date_time for info in wheel.infolist()}
    assert modes <= {0o644, 0o755, 0o664}, modes  # 0664: RECORD, as the wheel library always writes it
    assert len(times) == 1, times  # one time for every entry: the commit's
    lock = yaml.safe_load((one / LOCK_NAME).read_text())
    assert " + gpufleet 0.1.0 from " in lock["files"][0]["source"]  # the lock says which gpufleet built it
    said = capsys.readouterr().err
    assert "not reproducible: gpufleet's wheel: written by setuptools" in said  # the backend: not pinned


def git_tree(folder: Path) -> Path:
    folder.mkdir()
    (folder / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (folder / "run.sh").write_text("#!/bin/sh\n")
    (folder / "run.sh").chmod(0o775)
    (folder / "data.txt").write_text("data\n")
    (folder / "data.txt").chmod(0o664)  # a checkout made under umask 002
    (folder / ".gitignore").write_text("build/\n")
    (folder / "build" / "lib").mkdir(parents=True)
    (folder / "build" / "lib" / "deleted_long_ago.py").write_text("")
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "add", "."], check=True)
    env = {"GIT_COMMITTER_DATE": "@1700000000 +0000", "GIT_AUTHOR_DATE": "@1700000000 +0000"}
    commit = ["git", "-C", str(folder), *GIT_IDENTITY, "commit", "-q", "-m", "one"]
    subprocess.run(commit, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return folder


def test_the_wheel_is_built_from_the_commits_files_with_its_time_and_two_modes(tmp_path: Path) -> None:
    tree = source_tree(git_tree(tmp_path / "src"))
    assert tree.epoch == 1700000000 and tree.commit is not None and tree.changed == ()
    assert tree.files == (".gitignore", "data.txt", "pyproject.toml", "run.sh")  # no stale build/lib
    copy_tree(tree, tmp_path / "copy")
    assert (tmp_path / "copy" / "data.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "copy" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert tree.describe().endswith(f"from commit {tree.commit}")


def test_uncommitted_changes_are_named_and_change_the_lock_source(tmp_path: Path) -> None:
    root = git_tree(tmp_path / "src")
    clean = source_tree(root).describe()
    (root / "data.txt").write_text("edited\n")
    dirty = source_tree(root)
    assert dirty.changed == ("data.txt",)
    assert "with uncommitted changes (tree sha256 " in dirty.describe() and dirty.describe() != clean


def test_without_git_the_epoch_is_1980_unless_source_date_epoch_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "unpacked"
    root.mkdir()
    (root / "pyproject.toml").write_text("")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    tree = source_tree(root)
    assert (tree.commit, tree.epoch, tree.files) == (None, ZIP_EPOCH, ("pyproject.toml",))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert source_tree(root).epoch == 1700000000
    assert "without git (tree sha256 " in tree.describe()


def test_entries_the_manifest_leaves_open_are_named(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "schema_version": 1,
                "name": "open",
                "docker": {
                    "version": "27.5.1",
                    "source": {"kind": "http", "url": "https://x/d.tgz", "sha256": None},
                },
                "model": {"repo": "org/m", "revision": "master", "source": {"kind": "git-lfs"}},
                "images": [{"name": "a/b", "tag": "1", "source": {"kind": "docker-daemon"}}],
            }
        )
    )
    lines = unpinned(load_manifest(manifest))
    assert [line.split(":")[0] for line in lines] == ["docker", "image a/b", "model org/m"], lines
    assert unpinned(load_manifest(wheels_only(tmp_path))) == []


@pytest.mark.slow
def test_a_rebuild_that_changes_the_lock_removes_its_signature(tmp_path: Path) -> None:
    manifest = wheels_only(tmp_path)
    out = tmp_path / "bundle"
    build(manifest, out)
    (out / SIGNATURE_NAME).write_text("a signature of this lock\n")
    assert not build(manifest, out).unsigned and (out / SIGNATURE_NAME).exists()  # same lock: still good
    manifest.write_text(manifest.read_text().replace("wheels-only", "renamed"))
    assert build(manifest, out).unsigned and not (out / SIGNATURE_NAME).exists()
