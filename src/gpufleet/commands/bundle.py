"""``gpufleet bundle build --manifest M --out DIR`` and ``gpufleet bundle verify DIR``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from gpufleet.bundle import BuildError, LockError, ManifestError, build, verify

DEFAULT_MANIFEST = Path("offline_bundle/manifest.yml")


def register(subparsers: Any) -> None:
    """Add the ``bundle`` parser with its ``build`` and ``verify`` sub-commands."""
    parser = subparsers.add_parser("bundle", help="build or verify an offline bundle")
    commands = parser.add_subparsers(dest="bundle_command", metavar="SUBCOMMAND", required=True)
    build_parser = commands.add_parser("build", help="fetch every pinned artifact into a bundle directory")
    build_parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST, help="manifest YAML")
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
    build_parser.set_defaults(func=run_build)
    verify_parser = commands.add_parser("verify", help="check a bundle against its bundle.lock.yml")
    verify_parser.add_argument("bundle", type=Path, metavar="DIR", help="bundle directory")
    verify_parser.set_defaults(func=run_verify)


def run_build(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        result = build(
            args.manifest,
            args.out,
            include_optional=args.with_optional,
            trust_first_download=args.trust_first_download,
            console=console,
        )
    except ManifestError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    except (BuildError, LockError) as exc:
        print(f"gpufleet bundle build: {exc}", file=sys.stderr)
        return 1
    for name in result.skipped:
        console.print(f"skipped optional {name} (pass --with-optional to include it)")
    total = sum(entry.size for entry in result.lock.files)
    print(
        f"{args.out}: {len(result.lock.files)} files, {total / 2**20:.1f} MiB; "
        f"fetched {len(result.fetched)}, already present {len(result.reused)}"
    )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    try:
        problems = verify(args.bundle)
    except LockError as exc:
        print(exc, file=sys.stderr)
        return 1
    for line in problems:
        print(line)
    if problems:
        print(f"{args.bundle}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.bundle}: ok")
    return 0
