"""``gpufleet status -i INVENTORY``: is the Ray cluster whole and does vLLM serve? (read-only)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpufleet.commands.deploy import readable, run_reporting
from gpufleet.runner import ProgressSink, StatusReport, status
from gpufleet.runner.progress import print_status_report


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show Ray nodes alive, vLLM readiness (every replica of each service), its load and what each "
        "node runs (changes nothing)",
        description="Runs playbooks/status.yml: Ray's nodes and GPUs; whether vLLM lists the model; its load "
        "(requests running and waiting, KV-cache usage, tokens/s, TTFT p50/p99) from the monitoring stage's "
        "Prometheus over 5 minutes, else from two reads of vLLM's /metrics 5 s apart; each node's image ID, "
        "model commit and (head) vLLM config hash, with nodes that differ named; the gateway's routers on "
        "the head, each with the workers it finds healthy. With services (gpufleet_services): every replica "
        "(its node, GPUs, URL, its unit, whether it lists its model) and each service up, degraded (some "
        "replicas ready) or down. Exit 0 when every Ray node is alive, vLLM lists the model (services: every "
        "replica does) and every router runs with every worker healthy, 1 otherwise, 2 usage error.",
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def call(progress: ProgressSink | None) -> StatusReport:
        readable(args.inventory)  # an unreadable inventory is named here, not run against an empty one
        return status(args.inventory, progress=progress)

    return run_reporting(call, print_status_report, as_json=args.json)
