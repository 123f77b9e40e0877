"""``gpufleet demo``: the air-gapped end-to-end deployment on three offline lab hosts (gpufleet.lab.demo)."""

from __future__ import annotations

import argparse
from typing import Any

from gpufleet.commands.output import refuse
from gpufleet.lab import LabError, demo
from gpufleet.lab.state import check_name


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the air-gapped deployment of two services on 3 lab hosts from the lab bundle, a chat with each",
        description="What `make demo` runs after validating inventories/prod (root: the lab boots hosts): "
        "two services (tiny as 3 replicas, one per host; tiny-chat on the head) behind one endpoint. The "
        "lab stays up unless --down. Exit 0 when the deploy, the model list, a chat with each model and "
        "the 401 and 404 checks succeeded and no host sent anything beyond the lab, 1 otherwise.",
    )
    demo.build_parser(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Arguments that cannot work are refused before the bundle is built or a host boots (exit 2)."""
    problems = []
    try:
        check_name(args.name)
    except LabError as error:
        problems.append(str(error).removeprefix("lab: "))
    if args.bundle.exists() and not args.bundle.is_dir():
        problems.append(
            f"--bundle: {args.bundle}: found a file; expected a bundle directory (an existing one is "
            "completed and checked, a new one is built). Fix: pass a directory, e.g. --bundle dist/lab-bundle"
        )
    if problems:
        return refuse(problems, code=2, as_json=args.json, prefix="gpufleet demo: ")
    return demo.main_with(args)
