"""Two replicas of one model on one GPU behind vllm-router (issue 35's GPU measurement; the device side).

The replicas are the role's rendered instances r0 and r1 (services_render.sh: ``vllm serve --config
rN/node.yaml`` with the instance's env file, as the role's control script runs it), both on GPU 0 at
gpu_memory_utilization 0.4, started one after the other (vLLM's memory profiling measures free memory; two
profiles at once would see each other). In front of them, vllm-router as the gateway runs one per service:
static ``--worker-urls``, round robin, health checked every second, a worker whose circuit opened tried again
after 10 s (default 60). Measured, into OUT/summary.txt and
OUT/services.json:

1. start-up: each replica's ready time and KV cache, the GPU memory used;
2. routing: 40 sequential chats through the router, counted on each replica's own /metrics;
   the key forwarded (with it 200, without it 401 from the replica);
3. latency the router adds: 100 one-token completions direct to r0 and 100 through the router, interleaved;
4. throughput at concurrency 16 (64 tokens each): through the router (two replicas) and direct to r0 (one);
5. failover: steady load (4 streams) through the router, ``kill -9`` of r1's whole process group after 5 s:
   failed requests, when the last one failed, how the rest split; then r1 restarted and its share again.

Usage: python3 services_runner.py RENDERED_DIR OUT_DIR [PHASE ...] (default: every phase; start first)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

import yaml
from mp_runner import env_file, say  # same folder: the script's own path is on sys.path

VLLM = "import sys; sys.argv[0] = 'vllm'; from vllm.entrypoints.cli.main import main; main()"
ROUTER = "import sys; sys.argv[0] = 'vllm-router'; from vllm_router.launch_router import main; main()"
READY_LIMIT = 300
ROUTER_PORT = 8000
POLICIES = tuple(os.environ.get("POLICIES", "cache_aware power_of_two round_robin").split())  # run order
REPLICAS = ("r0", "r1")
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
         "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi")  # fmt: skip
LOG_KEYS = ("KV cache", "Maximum concurrency", "Model loading took", "init engine", "Error", "Traceback")


def http(url: str, key: str | None, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    try:
        request = urllib.request.Request(url, data=data, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, repr(e)


def gpu_used() -> str:
    query = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return repr(e)


def start_replica(rendered: Path, replica: str, out: Path) -> Popen:
    env = os.environ | env_file(rendered / replica / "node.env") | {"CUDA_VISIBLE_DEVICES": "0"}
    cmd = [sys.executable, "-c", VLLM, "serve", "--config", str(rendered / replica / "node.yaml")]
    log = (out / f"{replica}.log").open("a")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(base: str, key: str, proc: Popen, limit: float = READY_LIMIT) -> float | None:
    t0 = time.time()
    while time.time() - t0 < limit and proc.poll() is None:
        status, body = http(f"{base}/v1/models", key, timeout=5)
        if status == 200 and json.loads(body).get("data"):
            return time.time() - t0
        time.sleep(0.5)
    return None


def successes(base: str) -> float:
    """vllm:request_success_total summed over finish reasons, from the replica's own /metrics."""
    status, body = http(f"{base}/metrics", None, timeout=10)
    if status != 200:
        return float("nan")
    total = 0.0
    for line in body.splitlines():
        if line.startswith("vllm:request_success_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def prefix_cache(base: str) -> tuple[float, float]:
    """vLLM's prefix cache counters (hits, queries; in tokens), summed over the replica's /metrics series."""
    status, body = http(f"{base}/metrics", None, timeout=10)
    hits = queries = 0.0
    for line in body.splitlines() if status == 200 else []:
        if line.startswith(("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith(("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def chat(base: str, key: str | None, name: str, tokens: int) -> tuple[int, float]:
    body = {"model": name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    t0 = time.perf_counter()
    status, _ = http(f"{base}/v1/chat/completions", key, body)
    return status, time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def kill_group(proc: Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


@dataclass
class Bench:
    rendered: Path
    out: Path
    key: str
    name: str
    bases: dict[str, str]
    router: str = f"http://127.0.0.1:{ROUTER_PORT}"
    procs: dict[str, Popen] = field(default_factory=dict)
    figures: dict[str, object] = field(default_factory=dict)

    def say(self, *parts: object) -> None:
        say(self.out, *parts)

    def split(self, count: int, tokens: int) -> tuple[list[int], dict[str, float]]:
        """``count`` sequential chats through the router; what each replica's /metrics counted of them."""
        before = {r: successes(b) for r, b in self.bases.items()}
        statuses = [chat(self.router, self.key, self.name, tokens)[0] for _ in range(count)]
        after = {r: successes(b) for r, b in self.bases.items()}
        return sorted(set(statuses)), {r: after[r] - before[r] for r in REPLICAS}

    def start(self) -> None:
        for replica in REPLICAS:
            self.say(
                f"--- {replica}.yaml (as rendered)\n" + (self.rendered / replica / "node.yaml").read_text()
            )
            self.procs[replica] = start_replica(self.rendered, replica, self.out)
            took = wait_ready(self.bases[replica], self.key, self.procs[replica])
            self.say(f"{replica} ready after {took} s; GPU:", gpu_used())
            self.figures[f"{replica}_ready_s"] = took
            if took is None:
                raise RuntimeError(f"{replica} did not start")
        argv = [
            sys.executable, "-c", ROUTER, "--host", "127.0.0.1", "--port", str(ROUTER_PORT),
            "--worker-urls", *self.bases.values(), "--policy", "round_robin",
            "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", "29000",
            # how long a worker whose circuit opened stays out before a trial request (default 60 s)
            "--cb-timeout-duration-secs", "10",
        ]  # fmt: skip
        log = (self.out / "router.log").open("w")
        self.procs["router"] = Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        took = wait_ready(self.router, self.key, self.procs["router"], 60)
        self.say(f"router ready after {took} s")
        self.figures["router_ready_s"] = took
        with contextlib.suppress(OSError, AttributeError):
            status = Path(f"/proc/{self.procs['router'].pid}/status").read_text()
            self.figures["router_rss_mib"] = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def routing(self) -> None:
        statuses, split = self.split(40, 4)
        no_key = chat(self.router, None, self.name, 4)[0]
        nope = {"model": "nope", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        unknown = http(f"{self.router}/v1/chat/completions", self.key, nope)[0]
        self.say(f"routing: 40 chats through the router: statuses {statuses}, per replica {split};"
                 f" without the key {no_key}; unknown model {unknown}")  # fmt: skip
        self.figures |= {"routing_split": split, "routing_statuses": statuses, "no_key_status": no_key,
                         "unknown_model_status": unknown}  # fmt: skip

    def latency(self) -> None:
        direct, routed = [], []
        for _ in range(100):
            direct.append(chat(self.bases["r0"], self.key, self.name, 1)[1] * 1000)
            routed.append(chat(self.router, self.key, self.name, 1)[1] * 1000)
        pairs = (("direct", direct), ("routed", routed))
        figures = {f"{name}_p{round(q * 100)}": pct(values, q) for name, values in pairs for q in (0.5, 0.99)}
        self.say("latency of 1-token chats, ms:", {k: round(v, 2) for k, v in figures.items()})
        self.figures["latency_ms"] = figures

    def throughput(self) -> None:
        for label, target in (("router", self.router), ("direct", self.bases["r0"])):
            t1 = time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                done = list(pool.map(lambda _, t=target: chat(t, self.key, self.name, 64), range(160)))
            wall = time.perf_counter() - t1
            ok = sum(1 for s, _ in done if s == 200)
            self.say(f"throughput at concurrency 16 ({label}): {ok}/160 ok in {wall:.2f} s = {ok / wall:.2f}"
                     f" req/s, {ok * 64 / wall:.0f} output tok/s")  # fmt: skip
            self.figures[f"throughput_{label}_rps"] = ok / wall

    def failover(self) -> None:
        log: list[tuple[float, int]] = []
        stop = threading.Event()

        def stream() -> None:
            while not stop.is_set():
                status, _ = chat(self.router, self.key, self.name, 8)
                log.append((time.time(), status))

        threads = [threading.Thread(target=stream) for _ in range(4)]
        r0_before = successes(self.bases["r0"])
        started = time.time()
        for t in threads:
            t.start()
        time.sleep(5)
        killed_at = time.time()
        kill_group(self.procs["r1"], signal.SIGKILL)
        self.procs["r1"].wait()
        time.sleep(20)
        stop.set()
        for t in threads:
            t.join()
        failed = [(t - killed_at, s) for t, s in log if s != 200]
        last = max((t for t, _ in failed), default=0.0)
        after = [s for t, s in log if t - killed_at > last]
        self.say(f"failover: {len(log)} requests in {time.time() - started:.1f} s, {len(failed)} failed"
                 f" (statuses {sorted({s for _, s in failed})}), the last {last:.2f} s after the kill;"
                 f" after it {len(after)} requests, {sum(1 for s in after if s == 200)} ok;"
                 f" r0 served {successes(self.bases['r0']) - r0_before:.0f} in the window")  # fmt: skip
        ok_after = sum(1 for s in after if s == 200)
        self.figures["failover"] = {"requests": len(log), "failed": len(failed), "last_failure_s": last,
                                    "after": len(after), "ok_after": ok_after}  # fmt: skip

    def rejoin(self) -> None:
        """r1 started again: how long after it is ready the router sends it traffic (its circuit breaker)."""
        self.procs["r1"] = start_replica(self.rendered, "r1", self.out)
        took = wait_ready(self.bases["r1"], self.key, self.procs["r1"])
        ready_at, first = time.time(), None
        r1_before = successes(self.bases["r1"])
        while time.time() - ready_at < 120:
            chat(self.router, self.key, self.name, 2)
            if successes(self.bases["r1"]) > r1_before:
                first = time.time() - ready_at
                break
            time.sleep(0.5)
        statuses, split = self.split(20, 4)
        self.say(f"r1 restarted: ready after {took} s; its first routed request {first} s after that;"
                 f" then 20 chats: {statuses}, split {split}")  # fmt: skip
        self.figures |= {"rejoin_ready_s": took, "rejoin_first_request_s": first, "rejoin_split": split}

    def policies(self) -> None:
        """vllm-router's policies on a shared-prefix workload: 8 users, each with its own long system prompt
        (~1,200 tokens), 10 questions each, 4 at a time; then 20 sequential chats with distinct prompts. The
        prefix-cache hit rate is vLLM's own (both replicas' vllm:prefix_cache_hits / queries, in tokens)."""
        self.figures["policies"] = {}
        for port, policy in enumerate(POLICIES, start=ROUTER_PORT + 1):
            argv = [
                sys.executable, "-c", ROUTER, "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *self.bases.values(), "--policy", policy,
                "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(port + 29000 - ROUTER_PORT),
            ]  # fmt: skip
            log = (self.out / f"router-{policy}.log").open("w")
            self.procs[policy] = Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            router = f"http://127.0.0.1:{port}"
            if wait_ready(router, self.key, self.procs[policy], 60) is None:
                raise RuntimeError(f"router with --policy {policy} did not start")
            figures = self.shared_prefix(router, salt=policy)
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}
            self.say(f"policy {policy}:", shown)
            self.figures["policies"][policy] = figures  # type: ignore[index]
            kill_group(self.procs.pop(policy), signal.SIGTERM)

    def shared_prefix(self, router: str, salt: str) -> dict[str, object]:
        """Each policy gets prompts of its own (``salt`` first), so none finds another's prefixes cached."""
        users = [
            salt + " " + " ".join(f"{WORDS[(u * 7 + i) % len(WORDS)]}{u}" for i in range(1200))
            for u in range(8)
        ]

        def ask(job: tuple[int, int]) -> tuple[int, float]:
            user, question = job
            messages = [{"role": "system", "content": users[user]},
                        {"role": "user", "content": f"question {question}: say a word"}]  # fmt: skip
            body = {"model": self.name, "messages": messages, "max_tokens": 4, "temperature": 0}
            t0 = time.perf_counter()
            status, _ = http(f"{router}/v1/chat/completions", self.key, body)
            return status, time.perf_counter() - t0

        before = {r: prefix_cache(b) for r, b in self.bases.items()}
        served = {r: successes(b) for r, b in self.bases.items()}
        t1 = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            done = list(pool.map(ask, [(u, q) for q in range(10) for u in range(8)]))
        wall = time.perf_counter() - t1
        after = {r: prefix_cache(b) for r, b in self.bases.items()}
        hits = sum(after[r][0] - before[r][0] for r in REPLICAS)
        queries = sum(after[r][1] - before[r][1] for r in REPLICAS)
        split = {r: successes(b) - served[r] for r, b in self.bases.items()}
        served = {r: successes(b) for r, b in self.bases.items()}
        for i in range(20):  # distinct short prompts, one after another
            body = {"model": self.name, "messages": [{"role": "user", "content": f"{i} {WORDS[i % 16]}"}],
                    "max_tokens": 2}  # fmt: skip
            http(f"{router}/v1/chat/completions", self.key, body)
        latencies = [t * 1000 for _, t in done]
        return {
            "ok": sum(1 for status, _ in done if status == 200),
            "wall_s": wall,
            "p50_ms": pct(latencies, 0.5),
            "p99_ms": pct(latencies, 0.99),
            "prefix_hit_rate": hits / queries if queries else None,
            "split": split,
            "sequential_split": {r: successes(b) - served[r] for r, b in self.bases.items()},
        }

    def stop(self) -> None:
        for proc in self.procs.values():
            kill_group(proc, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                kill_group(proc, signal.SIGKILL)
        (self.out / "services.json").write_text(json.dumps(self.figures, indent=1, default=str))
        for log in [*REPLICAS, "router"]:
            path = self.out / f"{log}.log"
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            keep = [x for x in lines if any(k in x for k in LOG_KEYS)][:20] if log != "router" else lines[:15]
            self.say(
                f"--- {log} log ({len(lines)} lines):\n"
                + "\n".join(x[:300] for x in [*keep, "...", *lines[-20:]])
            )


def main() -> None:
    rendered, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    configs = {r: yaml.safe_load((rendered / r / "node.yaml").read_text(encoding="utf-8")) for r in REPLICAS}
    bench = Bench(
        rendered,
        out,
        key=env_file(rendered / "r0" / "node.env")["VLLM_API_KEY"],
        name=configs["r0"]["served-model-name"],
        bases={r: f"http://{c['host']}:{c['port']}" for r, c in configs.items()},
    )
    bench.say("GPU before:", gpu_used())
    phases = sys.argv[3:] or ["start", "routing", "latency", "throughput", "failover", "rejoin", "policies"]
    try:
        for phase in phases:
            getattr(bench, phase)()
    except Exception as e:  # the summary says what broke; the logs follow
        bench.say("FAILED:", repr(e)[:500])
        bench.figures["error"] = repr(e)[:500]
    finally:
        bench.stop()
    sys.exit(0 if "error" not in bench.figures else 1)


if __name__ == "__main__":
    main()
