"""gpufleet_model_check: a model directory that differs from its list is repaired, never trusted (issue 13).

Before: files not on the list were never looked at (an injected *.safetensors survived a re-deploy with
changed=0), and the relay untarred straight into the model directory. Now check names extra files,
symlinks and special files; record with prune removes them; promote moves a received copy from its staging
directory into place only after every file there matched, and leaves the model directory untouched otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import module_env

MODULE = Path(__file__).resolve().parents[2] / "plugins/modules/gpufleet_model_check.py"
REPO_ID = "org/tiny"
REV = "a" * 40


def run(tmp_path: Path, **args: Any) -> dict[str, Any]:
    params = tmp_path / "args.json"
    params.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"repo": REPO_ID, "revision": REV, **args}}))
    done = subprocess.run(
        [sys.executable, str(MODULE), str(params)],
        capture_output=True,
        text=True,
        check=False,
        env=module_env(tmp_path),
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def fill(folder: Path) -> dict[str, dict[str, Any]]:
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    files = {"config.json": b"{}", "model.safetensors": os.urandom(5000), "sub/tokenizer.json": b"[]"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()}


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    folder = tmp_path / "model"
    files = fill(folder)
    recorded = run(tmp_path, path=str(folder), files=files, state="record")
    assert recorded["ok"] and recorded["recorded"], recorded
    return folder, files


def test_an_injected_safetensors_makes_the_model_not_good(tmp_path: Path, model: tuple[Path, Any]) -> None:
    folder, files = model
    assert run(tmp_path, path=str(folder), files=files)["recorded"]
    (folder / "evil.safetensors").write_bytes(b"x")
    checked = run(tmp_path, path=str(folder), files=files)
    assert not checked["recorded"] and not checked["ok"]
    assert "evil.safetensors: extra file, not in the expected list (injected or stale)" in checked["problems"]
    by_marker = run(tmp_path, path=str(folder), verify="size")  # the list from the marker (online, fanout)
    assert not by_marker["recorded"] and any("evil.safetensors" in p for p in by_marker["problems"])


def test_a_symlink_in_place_of_a_file_is_not_trusted(tmp_path: Path, model: tuple[Path, Any]) -> None:
    folder, files = model
    real = tmp_path / "elsewhere"
    (folder / "config.json").rename(real)
    (folder / "config.json").symlink_to(real)
    checked = run(tmp_path, path=str(folder), files=files)
    assert "config.json: a symlink, expected a regular file" in checked["problems"], checked


def test_record_with_prune_repairs_the_directory(tmp_path: Path, model: tuple[Path, Any]) -> None:
    folder, files = model
    (folder / "sub" / "evil.safetensors").write_bytes(b"x")
    (folder / "link").symlink_to("/etc")
    (folder / ".git").mkdir()  # git's own directory is never pruned (online checkouts)
    repaired = run(tmp_path, path=str(folder), files=files, state="record", prune=True)
    assert repaired["ok"] and repaired["changed"], repaired
    assert sorted(repaired["removed"]) == ["link", "sub/evil.safetensors"]
    assert (folder / ".git").is_dir() and (Path("/etc")).is_dir()
    assert run(tmp_path, path=str(folder), files=files)["recorded"]


def test_promote_moves_a_matching_copy_into_place_and_prunes_the_rest(
    tmp_path: Path, model: tuple[Path, Any]
) -> None:
    folder, files = model
    (folder / "evil.safetensors").write_bytes(b"x")
    staging = tmp_path / "model.gpufleet-incoming"
    new_files = fill(staging)  # new random weights: a new revision of the model
    assert new_files != files
    promoted = run(tmp_path, path=str(folder), files=new_files, staging=str(staging), state="promote")
    assert promoted["ok"] and promoted["recorded"] and promoted["removed"] == ["evil.safetensors"], promoted
    assert not staging.exists()
    assert run(tmp_path, path=str(folder), files=new_files)["recorded"]


@pytest.mark.parametrize("fault", ["extra", "changed", "missing", "symlink"])
def test_promote_refuses_a_copy_that_differs_and_leaves_the_model_directory_alone(
    tmp_path: Path, model: tuple[Path, Any], fault: str
) -> None:
    folder, files = model
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    staging = tmp_path / "incoming"
    fill(staging)
    for name in files:  # the right bytes, as the lock says...
        (staging / name).write_bytes((folder / name).read_bytes())
    if fault == "extra":  # ...plus what an attacker or a broken sender added
        (staging / "evil.safetensors").write_bytes(b"x")
    elif fault == "changed":
        (staging / "model.safetensors").write_bytes(os.urandom(5000))
    elif fault == "missing":
        (staging / "sub" / "tokenizer.json").unlink()
    else:
        (staging / "sub" / "tokenizer.json").unlink()
        (staging / "sub" / "tokenizer.json").symlink_to(folder / "sub" / "tokenizer.json")
    refused = run(tmp_path, path=str(folder), files=files, staging=str(staging), state="promote")
    assert not refused["ok"] and not refused["recorded"] and refused["problems"], refused
    assert all(str(staging) in line for line in refused["problems"])
    assert not staging.exists()
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
