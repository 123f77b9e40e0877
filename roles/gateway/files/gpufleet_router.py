"""Run one vllm-router from its unpacked wheel: ``gpufleet-router CONFIG.json`` (the gateway role's launcher).

CONFIG names the wheel's directory (``path``) and the router's command-line arguments (``args``). Only the
router's own modules are imported: ``vllm_router.router_args``, ``vllm_router.router`` and the abi3 Rust
extension ``vllm_router_rs`` (its shared libraries are inside the wheel). The wheel's ``vllm-router`` entry
point (``launch_router``) would also import its Python fallback balancer, which needs aiohttp, fastapi,
uvicorn and orjson; with this launcher the host needs nothing but Python 3.8 or later.

A router in P/D mode (``--vllm-pd-disaggregation``) sends the replicas
``Authorization: Bearer $OPENAI_API_KEY`` from its own environment. The gateway role gives it the fleet's key
as the systemd credential ``key`` (``LoadCredential=``): the launcher reads ``$CREDENTIALS_DIRECTORY/key`` and
sets ``OPENAI_API_KEY`` in its own process, which the router's Rust code reads (``std::env::var``), so the key
is never in the unit, the configuration or the environment systemd shows.

Exit codes: 0 the router stopped, 2 usage, or a configuration or credential it cannot read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

PD_FLAG = "--vllm-pd-disaggregation"
KEY_VARIABLE = "OPENAI_API_KEY"  # what vllm-router's P/D mode sends the replicas as its Bearer token


def router_arguments(config: dict[str, Any]) -> list[str]:
    """The router's arguments from CONFIG, as strings; ValueError when they are not a list."""
    args = config.get("args")
    if not isinstance(args, list) or not isinstance(config.get("path"), str):
        raise ValueError("expected a JSON object with a string 'path' and a list 'args'")
    return [str(arg) for arg in args]


def load_key(env: Mapping[str, str]) -> str | None:
    """The credential ``key`` ($CREDENTIALS_DIRECTORY/key), None without it; ValueError when it is empty."""
    directory = env.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = os.path.join(directory, "key")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        key = handle.read().strip()
    if not key:
        raise ValueError(f"the credential {path} is empty; expected the fleet's API key")
    return key


def router_environment(args: list[str], env: Mapping[str, str]) -> dict[str, str]:
    """What to add to the router's environment: the credential's key as OPENAI_API_KEY. ValueError for a
    router in P/D mode that would have no key (it would send every replica an empty Bearer token: 401s)."""
    key = load_key(env)
    if key is not None:
        return {KEY_VARIABLE: key}
    if PD_FLAG in args and not env.get(KEY_VARIABLE):
        raise ValueError(
            f"{PD_FLAG}: found no credential 'key' and no {KEY_VARIABLE}; expected the fleet's API key, "
            "which the router sends the replicas in P/D mode. Fix: run the router through its unit (the "
            "gateway role's drop-in loads the key with LoadCredential=)"
        )
    return {}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gpufleet-router CONFIG.json", file=sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as handle:
            config = json.load(handle)
        args = router_arguments(config)
        # the same process runs the router: its Rust code reads this environment
        os.environ.update(router_environment(args, os.environ))
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
