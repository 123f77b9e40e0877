"""Run one vllm-router from its unpacked wheel: ``gpufleet-router CONFIG.json`` (the gateway role's launcher).

CONFIG names the wheel's directory (``path``) and the router's command-line arguments (``args``). Only the
router's own modules are imported: ``vllm_router.router_args``, ``vllm_router.router`` and the abi3 Rust
extension ``vllm_router_rs`` (its shared libraries are inside the wheel). The wheel's ``vllm-router`` entry
point (``launch_router``) would also import its Python fallback balancer, which needs aiohttp, fastapi,
uvicorn and orjson; with this launcher the host needs nothing but Python 3.8 or later.

Exit codes: 0 the router stopped, 2 usage or a configuration it cannot read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def router_arguments(config: dict[str, Any]) -> list[str]:
    """The router's arguments from CONFIG, as strings; ValueError when they are not a list."""
    args = config.get("args")
    if not isinstance(args, list) or not isinstance(config.get("path"), str):
        raise ValueError("expected a JSON object with a string 'path' and a list 'args'")
    return [str(arg) for arg in args]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gpufleet-router CONFIG.json", file=sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as handle:
            config = json.load(handle)
        args = router_arguments(config)
    except (OSError, ValueError) as error:
        print(f"gpufleet-router: {argv[0]}: {error}", file=sys.stderr)
        return 2
    sys.path.insert(0, config["path"])
    from vllm_router.router import Router  # type: ignore[import-not-found]  # noqa: PLC0415  (from path)
    from vllm_router.router_args import RouterArgs  # type: ignore[import-not-found]  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="gpufleet-router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    router_args = RouterArgs.from_cli_args(parser.parse_args(args), use_router_prefix=False)
    router_args._validate_router_args()  # what launch_router does before it starts the router
    Router.from_args(router_args).start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
