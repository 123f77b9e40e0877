"""Signing bundle.lock.yml where a bundle is built and checking the signature where it is deployed.

The lock names every file of the bundle by sha256, so a signature over the lock binds the whole bundle: the
verification of the files against the lock (``gpufleet bundle verify``, the preflight) does the rest. The
cryptography is OpenSSH's (``ssh-keygen -Y sign`` / ``-Y verify``, OpenSSH 8.2 or later): a signature in
namespace ``gpufleet-bundle`` in ``bundle.lock.yml.sig`` beside the lock, checked against an allowed-signers
file (ssh-keygen(1), ALLOWED SIGNERS: one ``principal key-type key`` line per trusted builder).

A check answers with one problem line, ``WHERE: VARIABLE: found X; expected Y. Fix: Z``, for: no signature,
a lock changed after signing (or a signature made for something else), a key the allowed signers do not
list. ``variable`` is how the caller was given the allowed signers (``--signer``,
``gpufleet_bundle_signers``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpufleet.bundle.lock import LOCK_NAME, SIGNATURE_NAME
from gpufleet.problems import Problem

NAMESPACE = "gpufleet-bundle"
_TIMEOUT = 120


class SignatureError(Exception):
    """A bundle's lock cannot be signed or its signature does not hold; ``problem`` says which and the fix."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


@dataclass(frozen=True)
class Signer:
    """Who signed a lock that verified: the allowed-signers principal and the key's fingerprint."""

    principal: str
    fingerprint: str


def _ssh_keygen(
    args: list[str], *, stdin: Path, stdout: int | None = None
) -> subprocess.CompletedProcess[str]:
    with stdin.open("rb") as data:
        try:
            return subprocess.run(
                ["ssh-keygen", *args],
                stdin=data,
                stdout=stdout if stdout is not None else subprocess.PIPE,
                stderr=subprocess.PIPE,
                timeout=_TIMEOUT,
                check=False,
                text=True,
            )
        except FileNotFoundError:
            raise SignatureError(
                Problem(
                    "control node",
                    "ssh-keygen",
                    "no ssh-keygen on PATH",
                    "OpenSSH's ssh-keygen (8.2 or later), which signs and verifies bundles",
                    "install the OpenSSH client (Debian: apt-get install openssh-client)",
                )
            ) from None


def _said(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (result.stderr or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit {result.returncode}"


def sign(bundle: Path, key: Path) -> Path:
    """Write ``bundle/bundle.lock.yml.sig``: ``ssh-keygen -Y sign`` of the lock with ``key`` (a private key,
    or a public key whose private half is in ssh-agent). An existing signature is replaced only by a good
    one: on a refusal the bundle is as it was."""
    lock, target = bundle / LOCK_NAME, bundle / SIGNATURE_NAME
    if not lock.is_file():
        raise SignatureError(
            Problem(
                str(lock),
                "lock",
                "no such file",
                "the lock `gpufleet bundle build` writes",
                "build the bundle first (`gpufleet bundle build --out DIR`), then sign DIR",
            )
        )
    if not key.is_file():
        raise SignatureError(
            Problem(
                str(key),
                "--key",
                "no such file",
                "an OpenSSH private key (or the public key of one held by ssh-agent)",
                "pass --key the key file, e.g. ~/.ssh/id_ed25519 (ssh-keygen -t ed25519 makes one)",
            )
        )
    descriptor, name = tempfile.mkstemp(prefix=".sig-", dir=bundle)
    try:
        with os.fdopen(descriptor, "w") as out:
            result = _ssh_keygen(
                ["-Y", "sign", "-f", str(key), "-n", NAMESPACE], stdin=lock, stdout=out.fileno()
            )
        if result.returncode != 0:
            raise SignatureError(
                Problem(
                    str(key),
                    "--key",
                    f"a key ssh-keygen cannot sign with ({_said(result)})",
                    "an OpenSSH private key that ssh-keygen -Y sign accepts",
                    "check the key and its passphrase, or add it to ssh-agent and pass its .pub",
                )
            )
        Path(name).chmod(0o644)
        os.replace(name, target)
    finally:
        Path(name).unlink(missing_ok=True)
    return target


def check(bundle: Path, signers: Path, *, variable: str = "--signer") -> Signer:
    """The lock's signer when its signature is good and by a key ``signers`` lists; else SignatureError."""
    lock, signature = bundle / LOCK_NAME, bundle / SIGNATURE_NAME
    resign = f"sign it where it was built (`gpufleet bundle sign --key KEY {bundle}`)"
    if not signers.is_file():
        raise SignatureError(
            Problem(
                str(signers),
                variable,
                "no such file",
                "an allowed-signers file (ssh-keygen(1) ALLOWED SIGNERS: `principal ssh-ed25519 AAAA...`)",
                f"write one line per trusted builder's public key into {signers}, or point {variable} at it",
            )
        )
    if not signature.is_file():
        raise SignatureError(
            Problem(
                str(lock),
                SIGNATURE_NAME,
                "an unsigned lock (no signature beside it)",
                f"a signature by a key that {signers} lists",
                f"{resign} and carry {SIGNATURE_NAME} with the bundle",
            )
        )
    intact = _ssh_keygen(["-Y", "check-novalidate", "-n", NAMESPACE, "-s", str(signature)], stdin=lock)
    if intact.returncode != 0:
        raise SignatureError(
            Problem(
                str(lock),
                SIGNATURE_NAME,
                f"a lock that does not match its signature ({_said(intact)}): changed after signing",
                "the lock exactly as it was signed",
                "take the bundle again from its builder; if the change is yours, review it "
                f"(`gpufleet bundle diff OLD NEW`) and have the builder {resign.removeprefix('sign it ')}",
            )
        )
    fingerprint = _fingerprint(intact.stdout)
    found = _ssh_keygen(["-Y", "find-principals", "-s", str(signature), "-f", str(signers)], stdin=lock)
    principal = found.stdout.strip().splitlines()[0].strip() if found.stdout.strip() else ""
    if found.returncode != 0 or not principal:
        raise SignatureError(
            Problem(
                str(signature),
                variable,
                f"a signature by key {fingerprint}, which {signers} does not list",
                f"a signature by a key that {signers} lists",
                f"use a bundle signed by a trusted builder, or add that builder's public key to {signers} "
                "once you know whose it is",
            )
        )
    verified = _ssh_keygen(
        ["-Y", "verify", "-f", str(signers), "-I", principal, "-n", NAMESPACE, "-s", str(signature)],
        stdin=lock,
    )
    if verified.returncode != 0:  # e.g. the key's valid-before has passed, or another namespace is allowed
        raise SignatureError(
            Problem(
                str(signature),
                variable,
                f"a signature by {principal} ({fingerprint}) that {signers} refuses ({_said(verified)})",
                f"a signature {signers} accepts for namespace {NAMESPACE}",
                f"check that builder's line in {signers} (namespaces=, valid-before=), or {resign}",
            )
        )
    return Signer(principal, fingerprint)


def _fingerprint(said: str) -> str:
    match = re.search(r"key (SHA256:\S+)", said)
    return match[1] if match else "of unknown fingerprint"
