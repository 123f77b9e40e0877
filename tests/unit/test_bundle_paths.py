"""Nothing outside a bundle is ever read as part of it, written or deleted (issue 13, data loss).

Before: a manifest model ``repo: ../..`` made `bundle build` delete the bundle's parent on a rebuild, and
`bundle verify` followed lock paths like ``../x`` or ``/etc/passwd`` and reported them as checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufleet.bundle import LockError, ManifestError, load_manifest, read_lock, verify
from gpufleet.bundle.lock import inside, sha256_file

ENTRY = {"size": 0, "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}


def write_lock(bundle: Path, path: str) -> None:
    bundle.mkdir(parents=True, exist_ok=True)
    entry = {"path": path, "version": "1", "source": "test", **ENTRY}
    (bundle / "bundle.lock.yml").write_text(yaml.safe_dump({"manifest": "t", "files": [entry]}))


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\..\\b"])
def test_a_lock_path_outside_the_bundle_is_refused_naming_the_entry(tmp_path: Path, path: str) -> None:
    write_lock(tmp_path / "bundle", path)
    with pytest.raises(LockError) as refused:
        read_lock(tmp_path / "bundle")
    message = str(refused.value)
    assert "files.0.path" in message and "not a relative path inside the bundle" in message
    assert "Fix: rebuild" in message


def test_a_symlink_out_of_the_bundle_is_a_problem_not_a_checked_file(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"")  # same size and sha256 as the entry: only the symlink check can catch it
    bundle = tmp_path / "bundle"
    write_lock(bundle, "docker/docker.tgz")
    (bundle / "docker").mkdir()
    (bundle / "docker" / "docker.tgz").symlink_to(outside)
    assert sha256_file(outside) == ENTRY["sha256"]
    (problem,) = verify(bundle)
    assert problem.startswith("docker/docker.tgz: escapes the bundle") and str(outside) in problem


def test_inside_refuses_a_symlinked_directory_leading_out(tmp_path: Path) -> None:
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "models").symlink_to(tmp_path)
    with pytest.raises(LockError, match="outside the bundle"):
        inside(tmp_path / "bundle", "models/x")
    assert inside(tmp_path / "bundle", "images/a.tar") == tmp_path / "bundle" / "images" / "a.tar"


@pytest.mark.parametrize("repo", ["../..", "org/..", "../name", "./x", "org/.hidden/x"])
def test_a_manifest_model_repo_that_leaves_models_is_refused(tmp_path: Path, repo: str) -> None:
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "schema_version": 1,
                "name": "t",
                "model": {"repo": repo, "revision": "master", "source": {"kind": "git-lfs", "url": "x"}},
            }
        )
    )
    keep = tmp_path / "keep.txt"
    keep.write_text("must survive")
    with pytest.raises(ManifestError) as refused:
        load_manifest(manifest)
    assert "model" in str(refused.value) and "repo" in str(refused.value)
    assert keep.read_text() == "must survive"
