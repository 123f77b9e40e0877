"""``gpufleet status -i INVENTORY``: is the Ray cluster whole and does vLLM serve? (read-only)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpufleet.commands.deploy import run_reporting
from gpufleet.runner import ProgressSink, StatusReport, status
from gpufleet.runner.progress import print_status_report


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show Ray nodes alive, vLLM readiness and its start-up facts (changes nothing)",
        description="Runs playbooks/status.yml. Exit 0 when every Ray node is alive and vLLM lists "
        "the model, 1 otherwise, 2 usage error.",
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def call(progress: ProgressSink | None) -> StatusReport:
        return status(args.inventory, progress=progress)

    return run_reporting(call, print_status_report, as_json=args.json)
