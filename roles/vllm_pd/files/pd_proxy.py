"""gpufleet's prefill/decode proxy: the one OpenAI-compatible endpoint of a disaggregated fleet.

Run by the vllm_pd role inside the head's container (it has vLLM's Python dependencies, aiohttp among them):
``python3 pd_proxy.py /etc/gpufleet/pd-proxy.json``, the API key in ``GPUFLEET_PD_API_KEY``. Each request to
``/v1/completions`` or ``/v1/chat/completions`` must carry ``Authorization: Bearer <key>`` (401 otherwise);
it goes first to a prefill instance (``max_tokens`` 1, not streamed; with NixlConnector ``kv_transfer_params``
asks it to keep the KV cache for a remote decode, as vLLM's toy_proxy_server.py does) and then, with the
``kv_transfer_params`` the prefill instance returned, to a decode instance, whose answer (streamed or not)
goes back to the client. Instances are taken round-robin within each pool. With P2pNcclConnector the
request id names both instances' KV addresses (``___prefill_addr_IP:PORT___decode_addr_IP:PORT_<uuid>``).
With connector ``none`` (test only) the same route runs without KV transfer.

``/health`` (no key) says how many instances each pool has and how many requests went to each;
``/v1/models`` (key) is the decode pool's answer. Every answer names the instances it went through in the
``X-Gpufleet-Prefill`` and ``X-Gpufleet-Decode`` headers.

The functions above ``main`` are plain Python (no aiohttp) so that gpufleet's unit tests import them.
"""

from __future__ import annotations

import copy
import hmac
import json
import os
import sys
import uuid
from typing import Any

ROUTES = ("/v1/completions", "/v1/chat/completions")


class RoundRobin:
    """The instances of one pool, taken in turn; counts what each was given."""

    def __init__(self, instances: list[dict[str, str]]) -> None:
        if not instances:
            raise ValueError("a pool needs at least one instance")
        self.instances = instances
        self.sent = {instance["name"]: 0 for instance in instances}
        self._next = 0

    def take(self) -> dict[str, str]:
        instance = self.instances[self._next % len(self.instances)]
        self._next += 1
        self.sent[instance["name"]] += 1
        return instance


def authorized(header: str | None, key: str) -> bool:
    """Whether an Authorization header carries the key (constant-time comparison)."""
    if not key or not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), key.encode())


def request_id(connector: str, prefill: dict[str, str], decode: dict[str, str]) -> str:
    """The X-Request-Id both instances see: P2pNcclConnector finds its peer in it."""
    if connector == "P2pNcclConnector":
        return f"___prefill_addr_{prefill['kv']}___decode_addr_{decode['kv']}_{uuid.uuid4().hex}"
    return uuid.uuid4().hex


def prefill_body(body: dict[str, Any], connector: str) -> dict[str, Any]:
    """The request as the prefill instance gets it: one token, not streamed, the KV cache kept."""
    out = copy.deepcopy(body)
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for name in ("stream_options", "min_tokens", "min_completion_tokens"):
        out.pop(name, None)
    if connector == "NixlConnector":
        out["kv_transfer_params"] = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
    return out


def decode_body(body: dict[str, Any], prefilled: dict[str, Any], connector: str) -> dict[str, Any]:
    """The client's request as the decode instance gets it, with where to pull the KV cache from."""
    out = copy.deepcopy(body)
    params = prefilled.get("kv_transfer_params")
    if connector == "NixlConnector" and params:
        out["kv_transfer_params"] = params
    return out


def load_config(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        config: dict[str, Any] = json.load(handle)
    for pool in ("prefill", "decode"):
        if not config.get(pool):
            raise SystemExit(f"{path}: no {pool} instance; expected at least one in each pool")
    return config


def error(status: int, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message, "type": "gpufleet_pd_proxy", "code": status}}


def main(argv: list[str]) -> int:  # noqa: PLR0915  # pragma: no cover - runs in the serving image (aiohttp)
    import aiohttp  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    from aiohttp import web  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

    config = load_config(argv[1] if len(argv) > 1 else "/etc/gpufleet/pd-proxy.json")
    key = os.environ.get("GPUFLEET_PD_API_KEY", "")
    if len(key) < 32:
        print(
            "GPUFLEET_PD_API_KEY: missing or shorter than 32 characters; refusing to serve", file=sys.stderr
        )
        return 2
    connector = str(config.get("connector", "NixlConnector"))
    pools = {pool: RoundRobin(config[pool]) for pool in ("prefill", "decode")}
    upstream = {"Authorization": f"Bearer {key}"}
    state: dict[str, Any] = {}

    def reply(status: int, payload: dict[str, Any], route: dict[str, str] | None = None) -> web.Response:
        return web.json_response(payload, status=status, headers=route or {})

    async def start(app: web.Application) -> None:
        state["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))

    async def stop(app: web.Application) -> None:
        await state["session"].close()

    async def generate(request: web.Request) -> web.StreamResponse:  # noqa: PLR0911
        if not authorized(request.headers.get("Authorization"), key):
            return reply(*error(401, "missing or wrong API key (send Authorization: Bearer <key>)"))
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return reply(*error(400, "the request body is not JSON"))
        if not isinstance(body, dict):
            return reply(*error(400, "the request body is not a JSON object"))
        prefill, decode = pools["prefill"].take(), pools["decode"].take()
        route = {"X-Gpufleet-Prefill": prefill["name"], "X-Gpufleet-Decode": decode["name"]}
        headers = upstream | {"X-Request-Id": request_id(connector, prefill, decode)}
        session: aiohttp.ClientSession = state["session"]
        try:
            async with session.post(
                prefill["url"] + request.path, json=prefill_body(body, connector), headers=headers
            ) as answer:
                text = await answer.text()
                if answer.status != 200:
                    return web.Response(
                        status=answer.status, text=text, content_type="application/json", headers=route
                    )
                prefilled = json.loads(text)
        except (aiohttp.ClientError, json.JSONDecodeError) as failed:
            return reply(*error(502, f"prefill instance {prefill['name']}: {failed}"), route)
        try:
            async with session.post(
                decode["url"] + request.path, json=decode_body(body, prefilled, connector), headers=headers
            ) as answer:
                if not body.get("stream"):
                    text = await answer.text()
                    return web.Response(
                        status=answer.status, text=text, content_type="application/json", headers=route
                    )
                response = web.StreamResponse(status=answer.status, headers=route)
                response.content_type = answer.content_type or "text/event-stream"
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as failed:
            return reply(*error(502, f"decode instance {decode['name']}: {failed}"), route)

    async def models(request: web.Request) -> web.Response:
        if not authorized(request.headers.get("Authorization"), key):
            return reply(*error(401, "missing or wrong API key (send Authorization: Bearer <key>)"))
        decode = pools["decode"].instances[0]
        try:
            async with state["session"].get(decode["url"] + "/v1/models", headers=upstream) as answer:
                return web.Response(
                    status=answer.status, text=await answer.text(), content_type="application/json"
                )
        except aiohttp.ClientError as failed:
            return reply(*error(502, f"decode instance {decode['name']}: {failed}"))

    async def health(request: web.Request) -> web.Response:
        return reply(
            200,
            {
                "connector": connector,
                "model": config.get("model"),
                "prefill": pools["prefill"].sent,
                "decode": pools["decode"].sent,
            },
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    for path in ROUTES:
        app.router.add_post(path, generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    print(
        f"gpufleet pd proxy on {config['host']}:{config['port']}: connector {connector}, "
        f"prefill {[i['name'] for i in config['prefill']]}, decode {[i['name'] for i in config['decode']]}",
        flush=True,
    )
    web.run_app(app, host=config["host"], port=int(config["port"]), print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
