"""``gpufleet validate -i INVENTORY``: check an inventory before anything touches a host."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check an inventory (groups, addresses, variables, parallelism, memory plan)",
        description="Exit 0 when the inventory is valid; otherwise print one line per problem and exit 1.",
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.fleet import validate_inventory  # noqa: PLC0415  (imports ansible: only when run)
    from gpufleet.fleet.services import served  # noqa: PLC0415

    result = validate_inventory(args.inventory)
    if args.json:
        report: dict[str, Any] = {
            "valid": not result.problems,
            "problems": [str(problem) for problem in result.problems],
            "warnings": result.warnings,
            "nodes": [node.name for node in result.fleet.nodes] if result.fleet else [],
        }
        print(json.dumps(report, indent=2))
        return 1 if result.problems else 0
    for problem in result.problems:
        print(problem, file=sys.stderr)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if result.problems:
        print(
            f"{args.inventory}: {len(result.problems)} problem(s); nothing was changed on any host.",
            file=sys.stderr,
        )
        return 1
    assert result.fleet is not None
    fleet = result.fleet
    print(
        f"{args.inventory}: valid — {len(fleet.nodes)} node(s), head {fleet.head.name}, "
        f"{fleet.total_gpus} GPU(s), {served(fleet)}"
    )
    return 0
