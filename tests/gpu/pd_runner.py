"""Run a P/D service's rendered files (pd_services_render.sh: gpufleet's services path) on ONE GPU (the device
side of pd_device_run.sh).

The prefill and the decode replica share GPU 0 (``CUDA_VISIBLE_DEVICES=0``, set here: placement gave each a
GPU of the two the render inventory declares; on real nodes each has its own); each is ``vllm serve --config
<role>.yaml`` with the environment of its rendered env file (like ``docker run --env-file``) less the NIC
settings of the render inventory (this machine's interface names differ). The prefill replica starts first
and the decode one once the prefill lists the model (two vLLM engines profiling one GPU at once would count
each other's memory). Then the service's vllm-router in P/D mode with its rendered arguments (router.json, the
gateway role's template), run by the gateway role's own launcher (roles/gateway/files/gpufleet_router.py) from
the wheel unpacked in ROUTER_DIR, with the key in ``OPENAI_API_KEY`` (what the launcher takes from the unit's
credential): chats with the key, streamed, without the key (the P/D router answers: on a host the gateway role
locks its port), the replicas' KV-transfer lines and /metrics, the router's P/D counters, and ``vllm bench
serve`` through the router. Then everything stopped with SIGTERM, and ONE plain instance (single.yaml: the
same settings, no roles) started on the same GPU and benched the same way. The engines log UCX's protocol
choice (``UCX_PROTO_INFO=y``); ``PD_UCX_TLS`` restricts UCX's transports, ``PD_SINGLE=0`` leaves the plain
instance out.

Usage: python3 pd_runner.py RENDERED_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from subprocess import Popen

import yaml
from mp_runner import VLLM, env_file, gpu_used, http, say

LIMIT = float(os.environ.get("PD_LIMIT", "560"))  # seconds for the whole run (the device call's limit is 600)
READY_LIMIT = 240
ROUTER = Path(__file__).resolve().parents[2] / "roles/gateway/files/gpufleet_router.py"
ROUTER_DIR = Path(os.environ.get("ROUTER_DIR", "/root/router"))
# the render inventory's NIC (eth0): not this machine's; one GPU per replica needs neither
NOT_HERE = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# UCX says which protocol and transport it picked for each operation (to the engines' logs)
UCX_ENV = {"UCX_PROTO_INFO": "y"} | (
    {"UCX_TLS": os.environ["PD_UCX_TLS"]} if os.environ.get("PD_UCX_TLS") else {}
)
KV_KEYS = re.compile(
    r"nixl|NIXL|Nixl|kv_transfer|KV Transfer|kv_connector|KVConnector|handshake|remote|UCX|ucx|"
    r"External prefix cache|side channel|Transfer plan|Registering|Error|rror:|Traceback|WARNING",
)
METRIC_KEYS = re.compile(r"nixl|kv_transfer|external_prefix_cache|prefix_cache_(hits|queries)|kv_connector")
# the router's P/D lines, without the histograms' buckets
ROUTER_KEYS = re.compile(r"^vllm_router_(pd_|worker_health)(?!.*_bucket)")
BENCH = ("--dataset-name", "random", "--random-input-len", "512", "--random-output-len", "64",
         "--num-prompts", "200", "--max-concurrency", "16", "--ignore-eos", "--disable-tqdm",
         "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99")  # fmt: skip
T0 = time.time()


def left() -> float:
    return LIMIT - (time.time() - T0)


def start(name: str, cmd: list[str], env: dict[str, str], out: Path) -> Popen[bytes]:
    log = (out / f"{name}.log").open("w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def start_vllm(host: str, rendered: Path, out: Path) -> Popen[bytes]:
    own = {k: v for k, v in env_file(rendered / f"{host}.env").items() if k not in NOT_HERE}
    env = os.environ | own | {"CUDA_VISIBLE_DEVICES": "0"}
    if host != "single":
        env |= UCX_ENV
    cmd = [sys.executable, "-c", VLLM, "serve", "--config", str(rendered / f"{host}.yaml")]
    return start(host, cmd, env, out)


def stop(procs: dict[str, Popen[bytes]], timeout: float = 60) -> dict[str, str]:
    """SIGTERM to each process group, SIGKILL after the timeout (the role's control script's stop)."""
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline, result = time.time() + timeout, {}
    for name, p in procs.items():
        try:
            p.wait(max(1, deadline - time.time()))
            result[name] = f"rc={p.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            result[name] = "killed after SIGTERM timeout"
    return result


def wait_models(url: str, key: str, procs: dict[str, Popen[bytes]], limit: float) -> list[str] | None:
    t0 = time.time()
    while time.time() - t0 < limit and all(p.poll() is None for p in procs.values()):
        try:
            status, body = http(f"{url}/v1/models", key)
            if status == 200:
                return [m["id"] for m in json.loads(body)["data"]]
        except OSError:
            pass
        time.sleep(1)
    return None


def raw(url: str, key: str | None, body: dict[str, object]) -> tuple[int, dict[str, str], str]:
    """POST with the route headers of the answer."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode(errors="replace")


def metrics(url: str, keys: re.Pattern[str] = METRIC_KEYS) -> str:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
            text: str = r.read().decode()
    except (OSError, urllib.error.HTTPError) as e:
        return f"/metrics: {e!r}"
    return "\n".join(x for x in text.splitlines() if keys.search(x) and not x.startswith("#"))


def bench(
    base: str, *, name: str, model: str, key: str, label: str, out: Path, seed: int = 0
) -> dict[str, object]:
    results = Path("/tmp/pd-bench")
    results.mkdir(exist_ok=True)
    cmd = [sys.executable, "-c", VLLM, "bench", "serve", "--backend", "openai", "--base-url", base,
           "--endpoint", "/v1/completions", "--model", name, "--tokenizer", model, *BENCH,
           "--seed", str(seed),
           "--save-result", "--result-dir", str(results), "--result-filename", f"{label}.json"]  # fmt: skip
    env = os.environ | {"OPENAI_API_KEY": key}
    t = time.time()
    with (out / "bench.log").open("a", encoding="utf-8") as f:
        f.write(f"=== {label}: vllm {' '.join(cmd[3:])}\n")
        f.flush()
        try:
            rc: int | str = subprocess.run(
                cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=min(200, left() - 20), check=False
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    say(out, f"bench ({label}): rc={rc} in {time.time() - t:.1f} s")
    saved = results / f"{label}.json"
    if not saved.exists():
        return {}
    data: dict[str, object] = json.loads(saved.read_text())
    wanted = ("completed", "failed", "duration", "request_throughput", "output_throughput", "mean_ttft_ms",
              "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
              "median_e2el_ms", "p99_e2el_ms")  # fmt: skip
    kept = {k: data.get(k) for k in wanted}
    say(out, f"bench ({label}) json:", json.dumps(kept))
    return kept


def log_lines(out: Path, host: str, limit: int = 60) -> str:
    lines = (out / f"{host}.log").read_text(errors="replace").splitlines()
    keys = [x[:400] for x in lines if KV_KEYS.search(x)]
    counts = {
        k: sum(k in x for x in lines) for k in ("NIXL", "Nixl", "nixl", "External prefix cache", "rror")
    }
    return f"{len(lines)} lines; counts {counts}\n" + "\n".join(keys[:limit])


def pd_part(rendered: Path, out: Path, key: str, results: dict[str, dict[str, object]]) -> bool:
    cfg = {h: yaml.safe_load((rendered / f"{h}.yaml").read_text()) for h in ("prefill", "decode")}
    name, model = cfg["decode"]["served-model-name"], cfg["decode"]["model"]
    for host in ("prefill", "decode"):
        say(out, f"--- {host}.yaml (as rendered)\n{(rendered / f'{host}.yaml').read_text()}")
        lines = [x for x in (rendered / f"{host}.env").read_text().splitlines() if "=" in x and x[0] != "#"]
        envs = [x.split("=")[0] + ("=<key>" if "KEY" in x else "=" + x.split("=", 1)[1]) for x in lines]
        say(out, f"--- {host}.env (key hidden): {envs}")
    procs: dict[str, Popen[bytes]] = {}
    ok = False
    try:
        for host in ("prefill", "decode"):
            t = time.time()
            procs[host] = start_vllm(host, rendered, out)
            url = f"http://{cfg[host]['host']}:{cfg[host]['port']}"
            listed = wait_models(url, key, procs, min(READY_LIMIT, left() - 200))
            say(
                out,
                f"{host} ready after {time.time() - t:.1f} s: models {listed}; GPU MiB used: {gpu_used()}",
            )
            if listed != [name]:
                return False
        urls = {h: f"http://{cfg[h]['host']}:{cfg[h]['port']}" for h in ("prefill", "decode")}
        procs["router"], ok = router_part(
            rendered, urls, name=name, model=model, key=key, out=out, results=results
        )
    except Exception as e:  # a failed check still stops everything and shows the logs
        say(out, "pd check failed:", repr(e)[:500])
        ok = False
    finally:
        t = time.time()
        order: dict[str, Popen[bytes]] = {k: procs[k] for k in ("router", "decode", "prefill") if k in procs}
        order |= {f"relay{i}": relay for i, relay in enumerate(RELAYS)}
        say(
            out,
            "stop (router, decode, prefill):",
            stop(order),
            f"in {time.time() - t:.1f} s; GPU MiB:",
            gpu_used(),
        )
        for host in ("prefill", "decode"):
            if (out / f"{host}.log").exists():
                say(out, f"--- {host} log, KV-transfer lines:\n{log_lines(out, host)}")
                tail = (out / f"{host}.log").read_text(errors="replace").splitlines()[-25:]
                say(out, f"--- {host} log tail:\n" + "\n".join(x[:400] for x in tail))
    return ok


# PD_SNIFF=1: a TCP relay in front of the decode replica that logs the first bytes of each request it carries
SNIFF_URL = "http://127.0.0.1:8111"
RELAYS: list[Popen[bytes]] = []
RELAY = r"""
import asyncio, sys
target, seen = int(sys.argv[1]), [0]
async def pipe(reader, writer, log):
    while data := await reader.read(65536):
        if log and data.startswith(b"POST") and seen[0] < 4:
            seen[0] += 1
            print("REQUEST", seen[0], data[:3000].decode(errors="replace").replace("\r\n", " | "), flush=True)
        writer.write(data)
        await writer.drain()
    writer.close()
async def serve(reader, writer):
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
    both = (pipe(reader, up_writer, True), pipe(up_reader, writer, False))
    await asyncio.gather(*both, return_exceptions=True)
async def main():
    async with await asyncio.start_server(serve, "127.0.0.1", 8111) as server:
        await server.serve_forever()
asyncio.run(main())
"""


def router_part(
    rendered: Path,
    urls: dict[str, str],
    *,
    name: str,
    model: str,
    key: str,
    out: Path,
    results: dict[str, dict[str, object]],
) -> tuple[Popen[bytes], bool]:
    """The service's vllm-router in P/D mode as rendered (its wheel here in ROUTER_DIR): chats, the bench."""
    config = json.loads((rendered / "router.json").read_text()) | {"path": str(ROUTER_DIR)}
    args = config["args"]
    if os.environ.get("PD_SNIFF") == "1":  # what the router sends the decode replica, through a logging relay
        relay = start(
            "relay", [sys.executable, "-c", RELAY, urls["decode"].rsplit(":", 1)[1]], dict(os.environ), out
        )
        RELAYS.append(
            relay
        )  # stopped with the replicas (a relay left running holds its port for the next run)
        time.sleep(1)
        args = [SNIFF_URL if arg == urls["decode"] else arg for arg in args]
        config["args"] = args
        say(out, f"relay {SNIFF_URL} -> {urls['decode']} (pid {relay.pid}): what the router sends decode")
    port, metrics_port = args[args.index("--port") + 1], args[args.index("--prometheus-port") + 1]
    path = out / "router.json"
    path.write_text(json.dumps(config))
    say(out, f"--- router.json (as rendered, its wheel here)\n{json.dumps(config)}")
    proc = start(
        "router", [sys.executable, str(ROUTER), str(path)], os.environ | {"OPENAI_API_KEY": key}, out
    )
    base = f"http://127.0.0.1:{port}"
    t, health = time.time(), None
    while time.time() - t < 60 and proc.poll() is None:
        try:
            health = http(f"{base}/health", None)
            if health[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.5)
    say(out, f"router /health after {time.time() - t:.1f} s: {health}")
    chat = {"model": name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
    t = time.time()
    status, _, body = raw(f"{base}/v1/chat/completions", key, chat)
    answer = json.loads(body) if status == 200 else {}
    content = answer["choices"][0]["message"]["content"] if answer else body[:300]
    say(out, f"chat through router with key: {status} in {time.time() - t:.2f} s, id {answer.get('id')!r}, "
             f"answer {content!r}")  # fmt: skip
    s_status, _, s_body = raw(f"{base}/v1/chat/completions", key, chat | {"stream": True})
    say(out, f"streamed chat through router: {s_status}, {s_body.count('data: ')} SSE chunks")
    n_status, _, n_body = raw(f"{base}/v1/chat/completions", None, chat)
    say(out, f"chat through router WITHOUT key: {n_status} {n_body[:120]!r} (the router adds its own key)")
    ok = status == 200 and bool(content) and s_status == 200
    time.sleep(6)  # vLLM logs its stats (KV Transfer metrics among them) every 5 s
    for role, url in urls.items():
        say(out, f"--- {role} /metrics after the chats (KV transfer, prefix cache):\n{metrics(url)}")
    if left() > 230:
        results["1P1D via vllm-router"] = bench(
            base, name=name, model=model, key=key, label="router", out=out
        )
        ok = ok and bool(results["1P1D via vllm-router"])
    else:
        say(out, f"bench (router): skipped, {left():.0f} s left")
    time.sleep(6)
    say(out, f"--- router /metrics (P/D):\n{metrics(f'http://127.0.0.1:{metrics_port}', ROUTER_KEYS)}")
    for role, url in urls.items():
        say(out, f"--- {role} /metrics after the bench:\n{metrics(url)}")
    return proc, ok


def single_part(rendered: Path, out: Path, key: str, results: dict[str, dict[str, object]]) -> bool:
    cfg = yaml.safe_load((rendered / "single.yaml").read_text())
    say(out, f"--- single.yaml (as rendered)\n{(rendered / 'single.yaml').read_text()}")
    url = f"http://{cfg['host']}:{cfg['port']}"
    t = time.time()
    procs = {"single": start_vllm("single", rendered, out)}
    try:
        listed = wait_models(url, key, procs, min(READY_LIMIT, left() - 40))
        say(out, f"single ready after {time.time() - t:.1f} s: models {listed}; GPU MiB used: {gpu_used()}")
        if listed != [cfg["served-model-name"]]:
            return False
        label = "single instance"
        name = cfg["served-model-name"]
        results[label] = bench(url, name=name, model=cfg["model"], key=key, label="single", out=out)
        return bool(results[label])
    finally:
        say(out, "stop (single):", stop(procs), "; GPU MiB:", gpu_used())
        tail = (out / "single.log").read_text(errors="replace").splitlines()
        say(
            out,
            "--- single log, key lines:\n"
            + "\n".join(x[:300] for x in tail if "rror" in x or "KV cache" in x),
        )


def table(results: dict[str, dict[str, object]]) -> str:
    cols = (("completed", "done"), ("request_throughput", "req/s"), ("output_throughput", "out tok/s"),
            ("median_ttft_ms", "TTFT p50 ms"), ("p99_ttft_ms", "TTFT p99 ms"),
            ("median_itl_ms", "ITL p50 ms"), ("p99_itl_ms", "ITL p99 ms"),
            ("median_tpot_ms", "TPOT p50 ms"), ("median_e2el_ms", "E2E p50 ms"))  # fmt: skip
    rows = ["| setup | " + " | ".join(c[1] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for label, data in results.items():
        cells = [f"{v:.2f}" if isinstance(v, float) else str(v) for v in (data.get(c[0]) for c in cols)]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    rendered, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    key = env_file(rendered / "prefill.env")["VLLM_API_KEY"]
    results: dict[str, dict[str, object]] = {}
    say(out, f"=== 1P1D (a P/D service, NixlConnector) on one GPU; GPU MiB used at start: {gpu_used()}")
    pd_ok = pd_part(rendered, out, key, results)
    say(out, f"=== 1P1D: {'PASS' if pd_ok else 'FAIL'} ({time.time() - T0:.0f} s so far)")
    single_ok = False
    if os.environ.get("PD_SINGLE") == "0":  # a second run that only changes the P/D pair's settings
        single_ok = True
        say(out, "single instance: not run (PD_SINGLE=0)")
    elif left() > 120:
        single_ok = single_part(rendered, out, key, results)
    else:
        say(out, f"single instance: skipped, {left():.0f} s left")
    say(out, f"=== single instance: {'PASS' if single_ok else 'FAIL'} ({time.time() - T0:.0f} s in all)")
    say(out, "bench: 200 random prompts, 512 tokens in, 64 out (ignore-eos), 16 at a time\n" + table(results))
    sys.exit(0 if pd_ok and single_ok else 1)


if __name__ == "__main__":
    main()
