"""The control node checks the bundle before the first stage that changes a host (issue 13, integrity timing).

Before: a corrupted bundle file was refused only in the artifacts stage, after the nodes stage had changed
hosts, and not at all when no node needed it. Now playbooks/preflight.yml checks the whole bundle on the
control node (the check of `gpufleet bundle verify`), and a cache keyed by the file's identity (device, inode,
size, mtime, ctime) keeps the check fast on every run without trusting a file that was rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.bundle.lock import Lock, lock_entry, write_lock
from gpufleet.bundle.verified import _cache_file, file_sha256, verify_cached

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def make_bundle(root: Path) -> Path:
    (root / "docker").mkdir(parents=True)
    (root / "models" / "m").mkdir(parents=True)
    (root / "docker" / "docker.tgz").write_bytes(os.urandom(200_000))
    (root / "models" / "m" / "model.safetensors").write_bytes(os.urandom(300_000))
    files = [
        lock_entry(root, rel, "1", "test") for rel in ("docker/docker.tgz", "models/m/model.safetensors")
    ]
    write_lock(root, Lock(manifest="t", files=files))
    return root


def flip_first_byte(target: Path) -> None:
    """Change the first byte in place (size kept). Writing a fixed byte left random data unchanged 1 time
    in 256: CI once saw the corrupted file pass its check (stop 45)."""
    with target.open("r+b") as out:
        first = out.read(1)[0]
        out.seek(0)
        out.write(bytes([first ^ 1]))


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return make_bundle(tmp_path / "bundle")


def test_the_second_run_hashes_nothing_unchanged(bundle: Path, tmp_path: Path) -> None:
    first = verify_cached(bundle, cache=tmp_path / "cache")
    again = verify_cached(bundle, cache=tmp_path / "cache")
    assert (first.problems, first.hashed, first.trusted) == ([], 2, 0)
    assert (again.problems, again.hashed, again.trusted) == ([], 0, 2)


def test_a_file_rewritten_with_the_same_size_and_mtime_is_hashed_again(bundle: Path, tmp_path: Path) -> None:
    """ctime is in the key: resetting mtime (touch -d) cannot make a changed file look verified."""
    verify_cached(bundle, cache=tmp_path / "cache")
    target = bundle / "docker" / "docker.tgz"
    before = target.stat()
    flip_first_byte(target)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    checked = verify_cached(bundle, cache=tmp_path / "cache")
    assert checked.hashed == 1 and checked.trusted == 1
    assert [p.split(":")[0] for p in checked.problems] == ["docker/docker.tgz"], checked.problems
    assert "corrupt: sha256" in checked.problems[0]


def test_a_file_the_bundle_check_matched_is_not_read_again_and_any_other_is(
    bundle: Path, tmp_path: Path
) -> None:
    """file_sha256 (lookup gpufleet_sha256: image_distribution's check of its archives before sending, issue
    15) takes the sha256 from the bundle check's cache only for the very file it matched. Proof that the cache
    is what answers: a cache entry naming another sha256 for the same identity is returned as it is; once the
    file is rewritten (size and mtime kept), the bytes are read again."""
    cache = tmp_path / "cache"
    target = bundle / "docker" / "docker.tgz"
    real = hashlib.sha256(target.read_bytes()).hexdigest()
    assert file_sha256(target, root=bundle, cache=cache) == real  # no cache yet: hashed
    verify_cached(bundle, cache=cache)
    cached = _cache_file(bundle, cache)
    entries = json.loads(cached.read_text())
    entries["files"]["docker/docker.tgz"][-1] = "c" * 64
    cached.write_text(json.dumps(entries))
    assert file_sha256(target, root=bundle, cache=cache) == "c" * 64
    assert file_sha256(target, cache=cache) == real  # no bundle named: always read
    before = target.stat()
    flip_first_byte(target)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert file_sha256(target, root=bundle, cache=cache) == hashlib.sha256(target.read_bytes()).hexdigest()
    outside = tmp_path / "elsewhere.tar"
    outside.write_bytes(b"image")
    assert file_sha256(outside, root=bundle, cache=cache) == hashlib.sha256(b"image").hexdigest()
    assert file_sha256(tmp_path / "absent.tar", root=bundle, cache=cache) == ""


def test_missing_and_extra_files_are_named_as_bundle_verify_names_them(bundle: Path, tmp_path: Path) -> None:
    verify_cached(bundle, cache=tmp_path / "cache")
    (bundle / "models" / "m" / "model.safetensors").unlink()
    (bundle / "models" / "m" / "evil.safetensors").write_bytes(b"x")
    problems = verify_cached(bundle, cache=tmp_path / "cache").problems
    assert problems == [
        "models/m/evil.safetensors: extra: not in bundle.lock.yml",
        "models/m/model.safetensors: missing; expected 300000 bytes (sha256 "
        + problems[1].split("(sha256 ")[1],
    ]


def test_an_unwritable_cache_only_costs_time(bundle: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    checked = verify_cached(bundle, cache=blocker / "cache")  # a file where a directory should be
    assert checked.problems == [] and checked.hashed == 2


def preflight_bundle(
    bundle: Path, tmp_path: Path, playbook: str = "playbooks/preflight.yml", signers: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Only the control-node check of a stage's playbook (tag preflight_bundle); no host is changed.

    The inventory is ``tmp_path/inventory/hosts.yml``; ``signers`` becomes gpufleet_bundle_signers."""
    inventory = tmp_path / "inventory" / "hosts.yml"
    inventory.parent.mkdir(exist_ok=True)
    signer_line = f"        gpufleet_bundle_signers: {signers}\n" if signers else ""
    inventory.write_text(
        "all:\n  children:\n    gpu_nodes:\n      hosts:\n        node1: {ansible_connection: local}\n"
        f"      vars:\n        gpufleet_bundle_dir: {bundle}\n{signer_line}"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    return subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            playbook,
            "-i",
            str(inventory),
            "--tags",
            "preflight_bundle",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_preflight_refuses_a_corrupted_bundle_before_any_host_changes(bundle: Path, tmp_path: Path) -> None:
    good = preflight_bundle(bundle, tmp_path)
    assert good.returncode == 0 and "2 file(s) hashed" in good.stdout, good.stdout + good.stderr
    again = preflight_bundle(bundle, tmp_path)
    assert again.returncode == 0 and "0 file(s) hashed, 2 unchanged" in again.stdout, again.stdout
    target = bundle / "models" / "m" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[0] ^= 1
    target.write_bytes(bytes(data))
    bad = preflight_bundle(bundle, tmp_path)
    assert bad.returncode != 0
    assert "does not match its bundle.lock.yml (1 problem(s)); nothing was changed on any host" in bad.stdout
    assert "models/m/model.safetensors: corrupt: sha256" in bad.stdout and "Fix: restore" in bad.stdout


@pytest.mark.slow
@pytest.mark.parametrize("playbook", ["playbooks/nodes.yml", "playbooks/artifacts.yml"])
def test_a_stage_run_alone_refuses_a_corrupted_bundle_first(
    bundle: Path, tmp_path: Path, playbook: str
) -> None:
    """`deploy --stages nodes` (or ansible-playbook playbooks/nodes.yml) skips preflight: the stage checks."""
    target = bundle / "docker" / "docker.tgz"
    flip_first_byte(target)
    bad = preflight_bundle(bundle, tmp_path, playbook)
    assert bad.returncode != 0, bad.stdout
    assert "docker/docker.tgz: corrupt: sha256" in bad.stdout
    assert "nothing was changed on any host" in bad.stdout
    assert "Gathering Facts" not in bad.stdout and "Validating arguments" not in bad.stdout  # it came first
