"""``gpufleet demo``: the air-gapped end-to-end deployment on three offline lab hosts (gpufleet.lab.demo)."""

from __future__ import annotations

import argparse
from typing import Any

from gpufleet.lab import demo


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the air-gapped deployment on 3 offline lab hosts from the lab bundle, and a chat completion",
        description="What `make demo` runs after validating inventories/prod (root: the lab boots hosts). "
        "The lab stays up unless --down. Exit 0 when the deploy, the chat completion and the 401 check "
        "succeeded and no host sent anything beyond the lab, 1 otherwise.",
    )
    demo.build_parser(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return demo.main_with(args)
