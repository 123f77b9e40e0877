"""``gpufleet teardown -i INVENTORY``: stop the gateway, vLLM and Ray; images, models and packages stay."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpufleet.commands.deploy import readable, run_reporting
from gpufleet.runner import DeployReport, ProgressSink, teardown
from gpufleet.runner.progress import print_deploy_report


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "teardown",
        help="stop the gateway, every vLLM instance and the Ray cluster (artifacts stay for the next deploy)",
        description="Runs playbooks/teardown.yml: the gateway's edge and routers, then every vLLM instance, "
        "the Ray cluster and monitoring stop (an unreadable inventory, or a --limit part that selects no "
        "host, is refused before anything connects). Exit 0 stopped, 1 a host failed, 2 usage error.",
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--limit", metavar="PATTERN", help="only these hosts (Ansible --limit)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def call(progress: ProgressSink | None) -> DeployReport:
        fleet = readable(args.inventory)  # read once: the check here and the --limit check in teardown()
        return teardown(fleet or args.inventory, limit=args.limit, progress=progress)

    return run_reporting(call, print_deploy_report, as_json=args.json)
