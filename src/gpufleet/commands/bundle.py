"""``gpufleet bundle build --manifest M --out DIR``, ``sign``, ``verify DIR [--signer FILE]`` and ``diff``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from gpufleet.bundle import BuildError, LockError, ManifestError, build, verify
from gpufleet.bundle.diff import diff_locks
from gpufleet.bundle.lock import SIGNATURE_NAME, read_lock_at
from gpufleet.bundle.signature import SignatureError, check, sign
from gpufleet.commands.output import emit, refuse
from gpufleet.paths import project_root

MANIFEST = Path("offline_bundle", "manifest.yml")


def default_manifest() -> Path:
    """offline_bundle/manifest.yml of the checkout or of the installed collection."""
    root = project_root()
    return root / MANIFEST if root else MANIFEST


def register(subparsers: Any) -> None:
    """Add the ``bundle`` parser with its ``build``, ``sign``, ``verify`` and ``diff`` sub-commands."""
    parser = subparsers.add_parser("bundle", help="build or verify an offline bundle")
    commands = parser.add_subparsers(dest="bundle_command", metavar="SUBCOMMAND", required=True)
    build_parser = commands.add_parser("build", help="fetch every pinned artifact into a bundle directory")
    build_parser.add_argument(
        "--manifest",
        type=Path,
        help="manifest YAML (default: offline_bundle/manifest.yml of gpufleet, checkout or installed)",
    )
    build_parser.add_argument(
        "--out", type=Path, required=True, help="bundle directory (created or completed)"
    )
    build_parser.add_argument(
        "--with-optional", action="store_true", help="also fetch entries marked optional (large ones)"
    )
    build_parser.add_argument(
        "--trust-first-download",
        action="store_true",
        help="accept http entries without a pinned sha256 (prints each digest to pin; the lock records it)",
    )
    build_parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    build_parser.set_defaults(func=run_build)
    sign_parser = commands.add_parser(
        "sign", help=f"sign a bundle's bundle.lock.yml with an SSH key (writes {SIGNATURE_NAME})"
    )
    sign_parser.add_argument("bundle", type=Path, metavar="DIR", help="bundle directory")
    sign_parser.add_argument(
        "--key",
        type=Path,
        required=True,
        help="OpenSSH private key (or the .pub of a key in ssh-agent); ssh-keygen -Y sign -n gpufleet-bundle",
    )
    sign_parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    sign_parser.set_defaults(func=run_sign)
    verify_parser = commands.add_parser("verify", help="check a bundle against its bundle.lock.yml")
    verify_parser.add_argument("bundle", type=Path, metavar="DIR", help="bundle directory")
    verify_parser.add_argument(
        "--signer",
        type=Path,
        metavar="ALLOWED_SIGNERS",
        help="also require a signature of the lock by a key this ssh-keygen allowed-signers file lists",
    )
    verify_parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    verify_parser.set_defaults(func=run_verify)
    diff_parser = commands.add_parser("diff", help="list what changed between two bundle locks")
    diff_parser.add_argument("old", type=Path, metavar="OLD", help="bundle directory or lock file")
    diff_parser.add_argument("new", type=Path, metavar="NEW", help="bundle directory or lock file")
    diff_parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    diff_parser.set_defaults(func=run_diff)


def run_build(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if args.out.exists() and not args.out.is_dir():
        message = f"--out {args.out}: found a file; expected a bundle directory (new or built before)."
        return refuse(
            [message + " Fix: choose a directory"],
            code=2,
            as_json=args.json,
            prefix="gpufleet bundle build: ",
        )
    try:
        result = build(
            args.manifest or default_manifest(),
            args.out,
            include_optional=args.with_optional,
            trust_first_download=args.trust_first_download,
            console=console,
        )
    except ManifestError as exc:
        return refuse([str(problem) for problem in exc.problems], code=2, as_json=args.json)
    except (BuildError, LockError) as exc:
        return refuse([str(exc)], code=1, as_json=args.json, prefix="gpufleet bundle build: ")
    total = sum(entry.size for entry in result.lock.files)
    if args.json:
        emit(
            {
                "ok": True,
                "bundle": str(args.out),
                "files": len(result.lock.files),
                "bytes": total,
                "fetched": list(result.fetched),
                "reused": list(result.reused),
                "skipped": list(result.skipped),
                "unreproducible": list(result.unreproducible),
                "signature_removed": result.unsigned,
            }
        )
        return 0
    for name in result.skipped:
        console.print(f"skipped optional {name} (pass --with-optional to include it)")
    for line in result.unreproducible:
        console.print(f"not reproducible: {line}", markup=False, highlight=False)
    if result.unsigned:
        console.print(
            f"{args.out / SIGNATURE_NAME}: removed: it signed the lock this build replaced. "
            f"Fix: gpufleet bundle sign --key KEY {args.out}",
            markup=False,
            highlight=False,
        )
    print(
        f"{args.out}: {len(result.lock.files)} files, {total / 2**20:.1f} MiB; "
        f"fetched {len(result.fetched)}, already present {len(result.reused)}"
    )
    return 0


def run_sign(args: argparse.Namespace) -> int:
    try:
        read_lock_at(args.bundle)  # a lock gpufleet cannot read is not worth a signature
        signature = sign(args.bundle, args.key)
    except (LockError, SignatureError) as exc:
        return refuse([str(exc)], code=1, as_json=args.json, prefix="gpufleet bundle sign: ")
    if args.json:
        emit({"ok": True, "bundle": str(args.bundle), "signature": str(signature)})
    else:
        print(f"{signature}: signed with {args.key}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    try:
        # The signature first: files are checked against a lock only once the lock is known to be genuine.
        signer = check(args.bundle, args.signer) if args.signer is not None else None
        problems = verify(args.bundle)
    except (LockError, SignatureError) as exc:
        return refuse([str(exc)], code=1, as_json=args.json)
    signed = f"signed by {signer.principal} ({signer.fingerprint})" if signer else ""
    if args.json:
        emit({"ok": not problems, "bundle": str(args.bundle), "problems": problems, "signer": signed or None})
        return 1 if problems else 0
    for line in problems:
        print(line)
    if problems:
        print(f"{args.bundle}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.bundle}: ok" + (f", {signed}" if signed else ""))
    return 0


def run_diff(args: argparse.Namespace) -> int:
    try:
        lines = diff_locks(read_lock_at(args.old), read_lock_at(args.new))
    except LockError as exc:
        return refuse([str(exc)], code=2, as_json=args.json, prefix="gpufleet bundle diff: ")
    if args.json:
        emit({"ok": True, "old": str(args.old), "new": str(args.new), "changes": lines})
        return 0
    for line in lines:
        print(line)
    print(f"{len(lines)} change(s)" if lines else "no change", file=sys.stderr)
    return 0
