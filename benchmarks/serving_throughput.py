"""Bounded load on a gpufleet vLLM endpoint: output tokens/s and latency at a fixed concurrency.

With --stream the answers are streamed and the report adds time to first token (ttft_p50_s, ttft_p95_s);
the verify stage runs it so with gpufleet_verify_benchmark: true.

    .venv/bin/python benchmarks/serving_throughput.py --endpoint http://10.231.0.2:8000/v1 \
        --key-file inventories/lab/gpufleet.apikey --model tiny --concurrency 8 --requests 64

Only loopback and the lab's network (10.231.0.0/16) are accepted as targets: this is a test tool for the
lab, never a load generator for someone else's server. Every run is bounded in requests and time.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import statistics
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ALLOWED = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("10.231.0.0/16"))


def allowed(endpoint: str) -> bool:
    host = urllib.parse.urlparse(endpoint).hostname or ""
    try:
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        return False
    return any(address in network for network in ALLOWED)


def one_request(
    endpoint: str, key: str, model: str, max_tokens: int, index: int, *, stream: bool = False
) -> tuple[float, int, float | None]:
    """(latency s, completion tokens, time to first token s: only when streaming) of one chat completion."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {index}: describe the cluster."}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(
        f"{endpoint}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    start = time.monotonic()
    first: float | None = None
    with urllib.request.urlopen(request, timeout=120) as response:
        if not stream:
            usage = json.loads(response.read())["usage"]
            return time.monotonic() - start, int(usage["completion_tokens"]), None
        tokens = 0
        for raw in response:  # server-sent events: "data: {...}" lines, then "data: [DONE]"
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.monotonic() - start
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return time.monotonic() - start, tokens, first


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[int(fraction * (len(ordered) - 1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="gpufleet_endpoint, e.g. http://10.231.0.2:8000/v1")
    parser.add_argument("--key-file", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64, help="total requests (at most 1000)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream", action="store_true", help="stream answers; report time to first token")
    args = parser.parse_args(argv)
    if not allowed(args.endpoint):
        print(f"{args.endpoint}: only loopback or the lab network 10.231.0.0/16", file=sys.stderr)
        return 2
    requests = min(args.requests, 1000)
    key = args.key_file.read_text(encoding="utf-8").strip()
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        results = list(
            pool.map(
                lambda i: one_request(args.endpoint, key, args.model, args.max_tokens, i, stream=args.stream),
                range(requests),
            )
        )
    wall = time.monotonic() - start
    latencies = [latency for latency, _, _ in results]
    tokens = sum(count for _, count, _ in results)
    firsts = [first for _, _, first in results if first is not None]
    report = {
        "concurrency": args.concurrency,
        "requests": requests,
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
        "output_tok_per_s": round(tokens / wall, 1),
        "latency_p50_s": round(statistics.median(latencies), 4),
        "latency_p95_s": round(percentile(latencies, 0.95), 4),
        "latency_p99_s": round(percentile(latencies, 0.99), 4),
    }
    if firsts:
        report |= {
            "ttft_p50_s": round(statistics.median(firsts), 3),
            "ttft_p95_s": round(percentile(firsts, 0.95), 3),
        }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
