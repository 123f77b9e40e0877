"""The ``gpufleet`` command: one sub-command per module in :mod:`gpufleet.commands`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module

from gpufleet._version import __version__

# Each module exposes ``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
COMMAND_MODULES = (
    "init",
    "validate",
    "plan",
    "lab",
    "bundle",
    "deploy",
    "status",
    "rollback",
    "teardown",
    "demo",
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` just that sub-command (no other module is imported).

    ``gpufleet plan`` is called by validate and preflight and must answer fast: importing every command
    module (the lab, the bundle builder, rich) would cost it more than planning does.
    """
    parser = argparse.ArgumentParser(
        prog="gpufleet",
        description="Bare GPU servers to a verified multi-node vLLM service, online or air-gapped.",
    )
    parser.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in [only] if only in COMMAND_MODULES else COMMAND_MODULES:
        module = import_module(f"gpufleet.commands.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 problems found, 2 usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        print("gpufleet: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
