"""``gpufleet rollback -i INVENTORY``: put every node's previous healthy revision back and pass the gate."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpufleet.commands.deploy import add_load_arguments, readable, run_reporting
from gpufleet.runner import DeployReport, ProgressSink, rollback
from gpufleet.runner.progress import print_deploy_report


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "rollback",
        help="restore the revision before the last healthy change (image, model, config, units) and check it",
        description=(
            "Runs playbooks/rollback.yml: every node puts its kept revision back, vLLM restarts when "
            "anything changed (Ray too when its own files or the image changed), and the restored revision "
            "must list its model and answer a "
            "completion; the downtime is measured. Services: the replicas restart one node at a time, each "
            "drained from its router first, under a steady load through the edge (--load). "
            "Rolling back twice returns to where you were. "
            "Exit 0 restored and serving, 1 it failed (the message says why), 2 usage error."
        ),
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument(
        "--to",
        choices=("previous", "current"),
        default="previous",
        help="previous (default): the revision before the last healthy change; current: the last healthy "
        "revision itself (after a change made outside gpufleet deploy, or with --no-rollback)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_load_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def call(progress: ProgressSink | None) -> DeployReport:
        fleet = readable(args.inventory)  # read once: the check here and the endpoint rollback() measures
        return rollback(
            fleet or args.inventory,
            to=args.to,
            progress=progress,
            load=args.load,
            load_interval=args.load_interval,
        )

    return run_reporting(call, print_deploy_report, as_json=args.json)
