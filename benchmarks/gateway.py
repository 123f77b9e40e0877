"""What the gateway costs on the lab: one vllm-router (the gateway role) in front of the deployed vLLM,
measured against vLLM directly, from the same host.

    make demo      # a deployed lab named demo, left up; its bundle (dist/lab-bundle) has the router's wheel
    sudo .venv/bin/python benchmarks/gateway.py [--name demo] [--rounds 3] \
        [--markdown benchmarks/results/gateway-lab.md]

``playbooks/gateway.yml`` puts one router on the head (service ``tiny``, its worker the head's vLLM), then
``benchmarks/serving_throughput.py`` runs **on the head** against both URLs, alternating direct and routed in
each round so that drift of the shared machine hits both alike: 1-token chats one at a time (the latency the
router adds, p50/p99) and 16-token chats 16 at a time (requests/s). The router is removed at the end (a run
with no services) and the key file copied to the head is deleted, so the lab is left as ``make demo`` left it.
CPU only, tiny model: the figures are the router's overhead against a fast backend, not vLLM's throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.lab import Lab
from gpufleet.lab.state import lab_dir

REPO = Path(__file__).resolve().parents[1]
ROUTER_PORT = 30080
METRICS_PORT = 29200
REMOTE = "/root/gpufleet-bench"
SHAPES = {"latency": ("1", "100", "1"), "throughput": ("16", "64", "16")}  # concurrency, requests, max tokens


def playbook(inventory: Path, services: list[dict[str, Any]], bundle: Path) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as extra:
        json.dump({"gateway_services": services, "gpufleet_bundle_dir": str(bundle)}, extra)
    try:
        argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                str(REPO / "playbooks" / "gateway.yml"), "-e", f"@{extra.name}"]  # fmt: skip
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    finally:
        os.unlink(extra.name)
    if done.returncode != 0:
        raise RuntimeError(f"gateway.yml failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")


def measure(lab: Lab, head: str, url: str, shape: str) -> dict[str, Any]:
    concurrency, requests, tokens = SHAPES[shape]
    argv = ["python3", f"{REMOTE}/serving_throughput.py", "--endpoint", url, "--key-file", f"{REMOTE}/key",
            "--model", "tiny", "--concurrency", concurrency, "--requests", requests,
            "--max-tokens", tokens]  # fmt: skip
    done = lab.ssh(head, argv, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{shape} against {url}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def run(name: str, rounds: int, bundle: Path) -> dict[str, Any]:
    lab = Lab(name)
    inventory = lab_dir(name) / "inventory" / "hosts.yml"
    head = lab.inventory().hosts[0]
    key = (inventory.parent / "gpufleet.apikey").read_text(encoding="utf-8").strip()
    urls = {"direct": f"http://{head.ip}:8000/v1", "routed": f"http://127.0.0.1:{ROUTER_PORT}/v1"}
    service = {
        "name": "tiny",
        "port": ROUTER_PORT,
        "metrics_port": METRICS_PORT,
        "workers": [f"http://{head.ip}:8000"],
    }
    started = time.time()
    t0 = time.monotonic()
    playbook(inventory, [service], bundle)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "cpus": os.cpu_count(),
        "gateway_install_s": round(time.monotonic() - t0, 1),
        "rounds": [],
    }
    script = (REPO / "benchmarks" / "serving_throughput.py").read_text(encoding="utf-8")
    install = (
        f"umask 077 && mkdir -p {REMOTE} && cat > {REMOTE}/serving_throughput.py"
        f" && printf %s {shlex.quote(key)} > {REMOTE}/key"
    )
    try:
        if lab.ssh(head.name, install, stdin=script).returncode != 0:
            raise RuntimeError(f"could not copy the load script to {head.name}")
        for shape in SHAPES:  # warm both paths once (the router's connection pool, vLLM's first requests)
            for url in urls.values():
                measure(lab, head.name, url, shape)
        for index in range(rounds):
            order = list(urls) if index % 2 == 0 else list(reversed(urls))
            found: dict[str, Any] = {
                shape: {p: measure(lab, head.name, urls[p], shape) for p in order} for shape in SHAPES
            }
            found["load_1min"] = round(os.getloadavg()[0], 1)
            results["rounds"].append(found)
            print(json.dumps(found), flush=True)
    finally:
        lab.ssh(head.name, ["rm", "-rf", REMOTE])
        playbook(inventory, [], bundle)
    results["summary"] = summary(results["rounds"])
    return results


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds of each figure, per path, and the router's difference."""

    def median(shape: str, path: str, key: str) -> float:
        return round(float(statistics.median(r[shape][path][key] for r in rounds)), 4)

    out: dict[str, Any] = {}
    for path in ("direct", "routed"):
        out[path] = {
            "latency_p50_ms": round(1000 * median("latency", path, "latency_p50_s"), 1),
            "latency_p99_ms": round(1000 * median("latency", path, "latency_p99_s"), 1),
            "c16_requests_per_s": round(64 / median("throughput", path, "wall_s"), 2),
            "c16_latency_p50_s": median("throughput", path, "latency_p50_s"),
        }
    out["added_p50_ms"] = round(out["routed"]["latency_p50_ms"] - out["direct"]["latency_p50_ms"], 1)
    out["added_p99_ms"] = round(out["routed"]["latency_p99_ms"] - out["direct"]["latency_p99_ms"], 1)
    ratio = out["routed"]["c16_requests_per_s"] / out["direct"]["c16_requests_per_s"]
    out["c16_routed_over_direct"] = round(ratio, 3)
    return out


def markdown(results: dict[str, Any]) -> str:
    s = results["summary"]
    rows = "\n".join(
        f"| {path} | {s[path]['latency_p50_ms']} | {s[path]['latency_p99_ms']} "
        f"| {s[path]['c16_requests_per_s']} | {s[path]['c16_latency_p50_s']} |"
        for path in ("direct", "routed")
    )
    return (
        "# The gateway on the lab: one vllm-router in front of the deployed vLLM (CPU, tiny model)\n\n"
        f"{results['date']}, {results['cpus']} CPUs, `benchmarks/gateway.py` on the `make demo` lab;"
        f" the router installed by `playbooks/gateway.yml` in {results['gateway_install_s']} s. Medians of"
        f" {len(results['rounds'])} rounds, each running direct and routed back to back (order alternating),"
        " both from the head (the router binds loopback there).\n\n"
        "| path | 1-token chat p50 ms | p99 ms | concurrency 16: requests/s | its latency p50 s |\n"
        "| --- | --- | --- | --- | --- |\n"
        f"{rows}\n\n"
        f"The router added **{s['added_p50_ms']} ms at p50 and {s['added_p99_ms']} ms at p99**; at"
        f" concurrency 16 routed/direct = {s['c16_routed_over_direct']}. One replica only: 1 against 3"
        " replicas through the gateway waits for replicas at run time (issue 35, part 3). The router, vLLM"
        " and the load generator share the machine's 2 cores here: at concurrency 16 the router's CPU is"
        " taken from vLLM's (on one H200 the same hop cost 12 %, `gateway-gpu.md`).\n\n"
        "Raw rounds:\n\n```json\n" + json.dumps(results, indent=1) + "\n```\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="demo")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bundle", type=Path, default=REPO / "dist" / "lab-bundle")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    results = run(args.name, args.rounds, args.bundle)
    print(json.dumps(results["summary"], indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(results), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
