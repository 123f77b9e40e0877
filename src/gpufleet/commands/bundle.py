"""``gpufleet bundle build --manifest M --out DIR`` and ``gpufleet bundle verify DIR``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from gpufleet.bundle import BuildError, LockError, ManifestError, build, verify
from gpufleet.commands.output import emit, refuse
from gpufleet.paths import project_root

MANIFEST = Path("offline_bundle", "manifest.yml")


def default_manifest() -> Path:
    """offline_bundle/manifest.yml of the checkout or of the installed collection."""
    root = project_root()
    return root / MANIFEST if root else MANIFEST


def register(subparsers: Any) -> None:
    """Add the ``bundle`` parser with its ``build`` and ``verify`` sub-commands."""
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
    verify_parser = commands.add_parser("verify", help="check a bundle against its bundle.lock.yml")
    verify_parser.add_argument("bundle", type=Path, metavar="DIR", help="bundle directory")
    verify_parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    verify_parser.set_defaults(func=run_verify)


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
            }
        )
        return 0
    for name in result.skipped:
        console.print(f"skipped optional {name} (pass --with-optional to include it)")
    print(
        f"{args.out}: {len(result.lock.files)} files, {total / 2**20:.1f} MiB; "
        f"fetched {len(result.fetched)}, already present {len(result.reused)}"
    )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    try:
        problems = verify(args.bundle)
    except LockError as exc:
        return refuse([str(exc)], code=1, as_json=args.json)
    if args.json:
        emit({"ok": not problems, "bundle": str(args.bundle), "problems": problems})
        return 1 if problems else 0
    for line in problems:
        print(line)
    if problems:
        print(f"{args.bundle}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.bundle}: ok")
    return 0
