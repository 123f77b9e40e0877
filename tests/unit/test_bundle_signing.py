"""Signed locks (issue 40): `gpufleet bundle sign` where the bundle is built; `bundle verify --signer`,
`deploy --bundle-signer` and the preflight (gpufleet_bundle_signers) refuse a lock that is unsigned, changed
after signing or signed by a key outside the allowed signers, each in one line with the file and the fix.
OpenSSH's ssh-keygen does the cryptography; the keys are made here, per test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.bundle.lock import LOCK_NAME, SIGNATURE_NAME, Lock, lock_entry, write_lock
from gpufleet.cli import main

from .test_bundle_verified import preflight_bundle

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def keypair(folder: Path, name: str) -> Path:
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """The builder's key, listed in allowed_signers; a stranger's, not listed."""
    folder = tmp_path / "keys"
    folder.mkdir()
    builder, stranger = keypair(folder, "builder"), keypair(folder, "stranger")
    allowed = folder / "allowed_signers"
    allowed.write_text(f"builder@example.org {(folder / 'builder.pub').read_text()}")
    return {"builder": builder, "stranger": stranger, "allowed": allowed}


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    (root / "docker").mkdir(parents=True)
    (root / "docker" / "docker-27.5.1.tgz").write_bytes(b"docker" * 1000)
    write_lock(root, Lock(manifest="t", files=[lock_entry(root, "docker/docker-27.5.1.tgz", "27.5.1", "t")]))
    return root


def cli(*argv: str | Path) -> int:
    return main([str(arg) for arg in argv])


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_a_signed_bundle_verifies_and_names_its_signer(
    bundle: Path, keys: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("bundle", "sign", "--key", keys["builder"], bundle) == 0
    assert (bundle / SIGNATURE_NAME).read_text().startswith("-----BEGIN SSH SIGNATURE-----")
    assert cli("bundle", "verify", "--signer", keys["allowed"], bundle) == 0
    assert "ok, signed by builder@example.org (SHA256:" in capsys.readouterr().out


def test_a_byte_changed_after_signing_is_refused(
    bundle: Path, keys: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("bundle", "sign", "--key", keys["builder"], bundle) == 0
    lock = bundle / LOCK_NAME
    lock.write_text(lock.read_text().replace("version: 27.5.1", "version: 27.5.2"))
    capsys.readouterr()
    assert cli("bundle", "verify", "--signer", keys["allowed"], bundle) == 1
    line = only_line(capsys.readouterr().err)
    assert line.startswith(f"{lock}: {SIGNATURE_NAME}: found a lock that does not match its signature"), line
    assert "changed after signing; expected the lock exactly as it was signed. Fix: " in line


def test_a_lock_signed_by_a_key_outside_the_allowed_signers_is_refused(
    bundle: Path, keys: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("bundle", "sign", "--key", keys["stranger"], bundle) == 0
    capsys.readouterr()
    assert cli("bundle", "verify", "--signer", keys["allowed"], bundle) == 1
    line = only_line(capsys.readouterr().err)
    assert line.startswith(f"{bundle / SIGNATURE_NAME}: --signer: found a signature by key SHA256:"), line
    assert f"which {keys['allowed']} does not list; expected a signature by a key that" in line
    assert "Fix: use a bundle signed by a trusted builder" in line


def test_an_unsigned_lock_is_refused_only_when_a_signer_is_configured(
    bundle: Path, keys: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("bundle", "verify", bundle) == 0
    capsys.readouterr()
    assert cli("bundle", "verify", "--signer", keys["allowed"], bundle) == 1
    line = only_line(capsys.readouterr().err)
    assert line == (
        f"{bundle / LOCK_NAME}: {SIGNATURE_NAME}: found an unsigned lock (no signature beside it); "
        f"expected a signature by a key that {keys['allowed']} lists. Fix: sign it where it was built "
        f"(`gpufleet bundle sign --key KEY {bundle}`) and carry {SIGNATURE_NAME} with the bundle"
    )


def test_the_signature_is_not_an_extra_file_of_the_bundle(bundle: Path, keys: dict[str, Path]) -> None:
    assert cli("bundle", "sign", "--key", keys["builder"], bundle) == 0
    assert cli("bundle", "verify", bundle) == 0


def test_a_refused_signing_keeps_the_signature_there_was(
    bundle: Path, keys: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("bundle", "sign", "--key", keys["builder"], bundle) == 0
    good = (bundle / SIGNATURE_NAME).read_bytes()
    not_a_key = keys["allowed"]  # a file, but no key
    capsys.readouterr()
    assert cli("bundle", "sign", "--key", not_a_key, bundle) == 1
    assert "--key: found a key ssh-keygen cannot sign with" in only_line(capsys.readouterr().err)
    assert (bundle / SIGNATURE_NAME).read_bytes() == good
    assert sorted(path.name for path in bundle.iterdir()) == ["bundle.lock.yml", SIGNATURE_NAME, "docker"]


def test_deploy_refuses_an_unsigned_bundle_before_any_stage(
    bundle: Path, keys: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The inventory does not exist: the refusal comes before anything reads it, let alone runs a stage."""
    argv = ["deploy", "-i", tmp_path / "none", "--bundle", bundle, "--bundle-signer", keys["allowed"]]
    assert cli(*argv) == 2
    err = capsys.readouterr().err
    assert f"{bundle / LOCK_NAME}: {SIGNATURE_NAME}: found an unsigned lock" in err
    assert "Nothing was changed on any host." in err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "refusal"),
    [
        ("unsigned", "found an unsigned lock (no signature beside it)"),
        ("stranger", "gpufleet_bundle_signers: found a signature by key SHA256:"),
        ("changed", "found a lock that does not match its signature"),
    ],
)
def test_preflight_refuses_the_bundle_before_any_host_changes(
    bundle: Path, keys: dict[str, Path], tmp_path: Path, case: str, refusal: str
) -> None:
    if case != "unsigned":
        assert (
            cli("bundle", "sign", "--key", keys["stranger" if case == "stranger" else "builder"], bundle) == 0
        )
    if case == "changed":
        with (bundle / LOCK_NAME).open("a") as lock:
            lock.write("# one more line\n")
    relative = Path(os.path.relpath(keys["allowed"], tmp_path / "inventory"))  # relative to the inventory
    run = preflight_bundle(bundle, tmp_path, signers=relative)
    assert run.returncode != 0, run.stdout
    assert refusal in run.stdout and "Nothing was changed on any host." in run.stdout, run.stdout
    assert "file(s) hashed" not in run.stdout  # the files were not even looked at


@pytest.mark.slow
def test_preflight_takes_a_signed_bundle_and_an_unsigned_one_without_signers(
    bundle: Path, keys: dict[str, Path], tmp_path: Path
) -> None:
    unsigned = preflight_bundle(bundle, tmp_path)
    assert unsigned.returncode == 0, unsigned.stdout
    assert cli("bundle", "sign", "--key", keys["builder"], bundle) == 0
    signed = preflight_bundle(bundle, tmp_path, signers=keys["allowed"])
    assert signed.returncode == 0, signed.stdout
    assert "lock signed by builder@example.org (SHA256:" in signed.stdout


@pytest.mark.slow
def test_a_stage_run_alone_refuses_an_unsigned_bundle(
    bundle: Path, keys: dict[str, Path], tmp_path: Path
) -> None:
    """`deploy --stages nodes` skips preflight: playbooks/bundle_check.yml checks the signature too."""
    run = preflight_bundle(bundle, tmp_path, "playbooks/nodes.yml", signers=keys["allowed"])
    assert run.returncode != 0, run.stdout
    assert "found an unsigned lock" in run.stdout and "Gathering Facts" not in run.stdout
