"""Run the roles' rendered Ray-executor configuration on one GPU machine (the device side): two "nodes" on a
2-GPU machine (shapes ``tp2``, ``pp2``), or the head alone on one GPU (shape ``tp1``: no worker rendered).

Input: the folders ``ray_render.sh`` writes (``tp2/``, ``pp2/``, ``tp1/``, ``tp1ray/``): per node the
ray_cluster role's container environment (``<node>.ray.env``) and systemd unit (``<node>.ray.service``), and
for the head vllm_service's ``head.yaml`` / ``head.env`` and what ray_cluster's wait probe expects
(``head.expected.json``).

1. Ray: each node is one ``ray start`` process with the arguments the unit passes to the container
   (``--entrypoint=ray IMAGE start ...``, taken from the unit's ExecStart as it is), the environment of the
   unit's ``--env-file`` and ``CUDA_VISIBLE_DEVICES`` = the node's GPU (the container's ``--gpus=all`` on a
   one-GPU node); ``--network=host`` = processes on the host. Head first, then the worker once the head's
   GCS port answers (the role's order), then ray_cluster's own probe (``files/ray_nodes.py``) until it
   reports every node with its GPU, then ``ray status``.
2. Per shape: ``vllm serve --config head.yaml`` on the head, with the head node's environment plus
   ``head.env`` (the role's ``docker exec --env-file`` into the head's container); ready = GET /v1/models
   with the key lists the served model; a chat completion with the key (200) and without (401); GET
   /metrics (200, ``vllm:`` metrics); ``ray status`` while it serves (every GPU of the cluster in use when
   head.yaml says ``distributed-executor-backend: ray``, none when it names no executor: vLLM's own); a
   short ``vllm bench serve``; SIGTERM to vLLM as the role's control script sends it, SIGKILL to its group
   after vllm_service_stop_timeout; GPU memory afterwards.
3. Stop both Ray nodes with SIGTERM (docker stop), then ``ray stop --force`` if anything is left.

Nothing rendered is edited. Usage:
    python3 ray_runner.py RENDERED_DIR OUT_DIR [--deadline S] [--ray-arg ARG]... [--ray-only] SHAPE...
``--ray-arg`` appends to both nodes' ``ray start`` (only for a CPU rehearsal: ``--num-gpus=1``);
``--ray-only`` stops after step 1 and the probe (the rehearsal on a machine without GPUs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from subprocess import Popen

import yaml

HERE = Path(__file__).resolve().parent
PROBE = HERE.parent.parent / "roles" / "ray_cluster" / "files" / "ray_nodes.py"
RAY = "import sys; sys.argv[0] = 'ray'; from ray.scripts.scripts import main; sys.exit(main())"
VLLM = "import sys; sys.argv[0] = 'vllm'; from vllm.entrypoints.cli.main import main; main()"
GPUS = {"head": 0, "worker": 1}  # node -> its GPU
STOP_TIMEOUT = 60  # vllm_service_stop_timeout
RAY_STOP_TIMEOUT = 30  # ray_cluster_stop_timeout
LOG_KEYS = (
    "non-default args", "Ray", "ray", "world_size", "Loading weights took", "Model loading took", "KV cache",
    "Maximum concurrency", "init engine", "Starting vLLM API server", "Error", "Traceback", "rror:",
)  # fmt: skip
T0 = time.time()


def say(out: Path, *parts: object) -> None:
    line = " ".join(str(p) for p in parts)
    print(f"[{time.time() - T0:6.1f}s] {line}", flush=True)
    with (out / "summary.txt").open("a", encoding="utf-8") as f:
        f.write(line + "\n")


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines, as docker --env-file reads them (no quoting; # comments)."""
    pairs = (line.split("=", 1) for line in path.read_text(encoding="utf-8").splitlines() if "=" in line)
    return {k: v for k, v in pairs if not k.startswith("#")}


def unit_exec_start(unit: Path) -> list[str]:
    """The ExecStart command line of a rendered unit, split as systemd does (quotes, %% and $$)."""
    lines = unit.read_text(encoding="utf-8").splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("ExecStart="))
    command = lines[i].removeprefix("ExecStart=")
    while command.endswith("\\"):
        i += 1
        command = command[:-1] + " " + lines[i].strip()
    return [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(command)]


def ray_start_args(unit: Path) -> list[str]:
    """The `ray start ...` arguments the unit's `docker run --entrypoint=ray IMAGE` passes, checked."""
    argv = unit_exec_start(unit)
    assert argv[1] == "run" and "--network=host" in argv, argv
    at = argv.index("--entrypoint=ray")
    args = argv[at + 2 :]
    assert args[0] == "start" and "--block" in args, args
    return args


def arg_value(args: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(name + "=")), None)


def http(url: str, key: str | None, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, headers=headers), timeout=timeout
        ) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def gpu_used() -> list[int] | str:
    """MiB in use on each GPU (nvidia-smi), or why it could not be read."""
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    try:
        result = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
        return [int(x) for x in result.stdout.split()]
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return repr(e)[:200]


def run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int | str, str]:
    try:
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        return result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as e:
        return "timeout", str(e.stdout or "") + str(e.stderr or "")
    except OSError as e:  # a tool the machine lacks (pgrep)
        return "error", repr(e)


class Cluster:
    """The two Ray nodes, started from the rendered units."""

    def __init__(self, rendered: Path, out: Path, extra: list[str]) -> None:
        self.rendered, self.out, self.extra = rendered, out, extra
        self.procs: dict[str, Popen] = {}
        # The nodes rendered for this shape: head and worker, or the head alone (tp1)
        self.nodes = [node for node in GPUS if (rendered / f"{node}.ray.service").exists()]
        self.gpus = f"{len(self.nodes)}.0 GPU"  # as `ray status` writes the cluster's total
        self.args = {node: ray_start_args(rendered / f"{node}.ray.service") for node in self.nodes}
        self.head_ip = arg_value(self.args["head"], "--node-ip-address")
        self.address = f"{self.head_ip}:{arg_value(self.args['head'], '--port')}"

    def env(self, node: str) -> dict[str, str]:
        """The node's container environment: the host's, the unit's --env-file, and the node's GPU."""
        return (
            os.environ
            | env_file(self.rendered / f"{node}.ray.env")
            | {"CUDA_VISIBLE_DEVICES": str(GPUS[node])}
        )

    def start(self, node: str) -> None:
        cmd = [sys.executable, "-c", RAY, *self.args[node], *self.extra]
        say(self.out, f"ray {node}: CUDA_VISIBLE_DEVICES={GPUS[node]} ray", shlex.join(cmd[3:]))
        log = (self.out / f"ray-{node}.log").open("w")
        self.procs[node] = Popen(
            cmd, env=self.env(node), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_port(self, limit: float = 120) -> bool:
        host, port = self.address.rsplit(":", 1)
        deadline = time.time() + limit
        while time.time() < deadline and self.procs["head"].poll() is None:
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                return True
            except OSError:
                time.sleep(0.5)
        return False

    def probe(self, limit: float = 180) -> dict:
        """ray_cluster's wait probe (files/ray_nodes.py), run as the role runs it in the head's container."""
        expected = (self.rendered / "head.expected.json").read_text(encoding="utf-8")
        cmd = [sys.executable, "-", json.dumps(json.loads(expected)), self.address]
        deadline = time.time() + limit
        result: dict = {}
        while time.time() < deadline and all(p.poll() is None for p in self.procs.values()):
            done = subprocess.run(cmd, input=PROBE.read_text(), env=self.env("head"), capture_output=True,
                                  text=True, timeout=120, check=False)  # fmt: skip
            try:
                result = json.loads(done.stdout)
            except json.JSONDecodeError:
                result = {"error": (done.stdout + done.stderr)[-500:]}
            if result.get("alive") and not result.get("missing"):
                return result
            time.sleep(2)
        return result

    def status_until(self, label: str, wanted: str, limit: float = 60) -> str:
        """`ray status` until its text holds ``wanted`` (its resource view lags a node's registration)."""
        deadline = time.time() + limit
        while True:
            rc, text = run(
                [sys.executable, "-c", RAY, "status", f"--address={self.address}"], self.env("head"), 60
            )
            if wanted in text or time.time() > deadline:
                say(
                    self.out,
                    f"--- ray status ({label}), rc={rc}, {wanted!r} found: {wanted in text}:\n{text.strip()}",
                )
                return text
            time.sleep(2)

    def stop(self) -> None:
        """docker stop --time 30 on each node, worker first: SIGTERM to `ray start --block` alone (the
        container's init passes it to its child only), then SIGKILL to what is left of the node."""
        t = time.time()
        result = {}
        for node in ("worker", "head"):
            p = self.procs.get(node)
            if p is None:
                continue
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(RAY_STOP_TIMEOUT)
                result[node] = f"rc={p.returncode}"
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                result[node] = "killed after SIGTERM timeout"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # what is left of the node's "container"
        time.sleep(1)
        left = run(["pgrep", "-c", "-f", "raylet|gcs_server"], dict(os.environ), 10)[1].strip()
        say(self.out, f"ray stop (SIGTERM): {result} in {time.time() - t:.1f} s; Ray processes left: {left}")
        if left not in ("", "0"):
            rc, text = run([sys.executable, "-c", RAY, "stop", "--force"], dict(os.environ), 60)
            say(self.out, f"ray stop --force: rc={rc} {text.strip()[-300:]}")


def bench(base: str, name: str, *, model: str, key: str, shape: str, out: Path, limit: float) -> None:
    """A short `vllm bench serve` (random 512-token prompts, 128 tokens out, 32 at a time)."""
    results = Path("/tmp/ray16-bench")
    results.mkdir(exist_ok=True)
    cmd = [sys.executable, "-c", VLLM, "bench", "serve", "--backend", "openai", "--base-url", base,
           "--endpoint", "/v1/completions", "--model", name, "--tokenizer", model, "--dataset-name", "random",
           "--random-input-len", "512", "--random-output-len", "128", "--num-prompts", "256",
           "--max-concurrency", "32", "--ignore-eos", "--seed", "0", "--disable-tqdm",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", str(results), "--result-filename", f"{shape}.json"]  # fmt: skip
    env = os.environ | {"OPENAI_API_KEY": key}
    t = time.time()
    rc, text = run(cmd, env, limit)
    with (out / "bench.log").open("a", encoding="utf-8") as f:
        f.write(f"=== {shape}: {shlex.join(cmd[3:])}\nrc={rc} in {time.time() - t:.1f} s\n{text}\n")
    keep = [x for x in text.splitlines() if ":" in x and any(k in x for k in ("throughput", "TTFT", "TPOT",
            "ITL", "E2EL", "Successful", "Failed", "duration", "Total"))]  # fmt: skip
    say(out, f"bench ({shape}): rc={rc} in {time.time() - t:.1f} s\n" + "\n".join(keep))
    saved = results / f"{shape}.json"
    if saved.exists():
        data = json.loads(saved.read_text())
        wanted = ("completed", "failed", "duration", "request_throughput", "output_throughput",
                  "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                  "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms")  # fmt: skip
        say(out, f"bench ({shape}) json:", json.dumps({k: data.get(k) for k in wanted}))


def run_shape(cluster: Cluster, shape_dir: Path, out: Path, deadline: float) -> bool:
    cfg = yaml.safe_load((shape_dir / "head.yaml").read_text(encoding="utf-8"))
    key = env_file(shape_dir / "head.env")["VLLM_API_KEY"]
    base, name = f"http://{cfg['host']}:{cfg['port']}", cfg["served-model-name"]
    shape = shape_dir.name
    say(out, f"=== {shape}: TP {cfg['tensor-parallel-size']} x PP {cfg['pipeline-parallel-size']}", base)
    say(out, f"--- head.yaml (as rendered)\n{(shape_dir / 'head.yaml').read_text(encoding='utf-8')}")
    for node in cluster.nodes:
        same = (shape_dir / f"{node}.ray.service").read_bytes() == (
            cluster.rendered / f"{node}.ray.service"
        ).read_bytes()
        same &= (shape_dir / f"{node}.ray.env").read_bytes() == (
            cluster.rendered / f"{node}.ray.env"
        ).read_bytes()
        say(out, f"{node}: Ray unit and env of this shape identical to the running cluster's: {same}")
    # The role: docker exec --env-file head.env into the head's container (its env: the head's ray.env).
    env = cluster.env("head") | env_file(shape_dir / "head.env")
    cmd = [sys.executable, "-c", VLLM, "serve", "--config", str(shape_dir / "head.yaml")]
    t0 = time.time()
    log = (out / f"{shape}-vllm.log").open("w")
    proc = Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ok = False
    try:
        listed = None
        while time.time() < min(deadline - 60, t0 + 300) and proc.poll() is None:
            try:
                status, body = http(f"{base}/v1/models", key, timeout=5)
                if status == 200:
                    listed = [m["id"] for m in json.loads(body)["data"]]
                    break
            except OSError:
                pass
            time.sleep(1)
        ready = time.time() - t0
        say(
            out,
            f"ready after {ready:.1f} s: models {listed}; vllm rc {proc.poll()}; GPU MiB used:",
            gpu_used(),
        )
        if listed is not None:
            chat = {"model": name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
                    "temperature": 0}  # fmt: skip
            t1 = time.time()
            with_key, body = http(f"{base}/v1/chat/completions", key, chat)
            took = time.time() - t1
            answer = json.loads(body)["choices"][0]["message"]["content"] if with_key == 200 else body[:300]
            without_key, body_nokey = http(f"{base}/v1/chat/completions", None, chat)
            models_nokey, _ = http(f"{base}/v1/models", None)
            say(out, f"chat with key: {with_key} in {took:.2f} s, answer {answer!r}")
            say(out, f"chat without key: {without_key} {body_nokey[:120]!r}")
            say(out, f"/v1/models without key: {models_nokey}")
            metrics, text = http(f"{base}/metrics", None)
            vllm_lines = [x for x in text.splitlines() if x.startswith("vllm:")]
            (out / f"{shape}-metrics.txt").write_text(text, encoding="utf-8")
            some = [x[:120] for x in vllm_lines if "num_requests" in x or "prompt_tokens_total" in x]
            say(out, f"GET /metrics without key: {metrics}, {len(vllm_lines)} vllm: samples, e.g.", some[:4])
            # "1.0/1.0 GPU" (or 2.0/2.0): every GPU of the cluster held by vLLM's Ray workers; without
            # distributed-executor-backend (one GPU: the role renders none) vLLM runs its own, Ray holds none.
            on_ray = cfg.get("distributed-executor-backend") == "ray"
            busy = f"{cluster.gpus[:-4] if on_ray else '0.0'}/{cluster.gpus}"
            say(
                out, f"executor in head.yaml: {cfg.get('distributed-executor-backend')}; Ray must show {busy}"
            )
            gpus_used = busy in cluster.status_until(f"{shape} serving", busy, 20)
            ok = (
                listed == [name]
                and with_key == 200
                and without_key == 401
                and models_nokey == 401
                and metrics == 200
                and len(vllm_lines) > 0
                and gpus_used
            )
            left = deadline - time.time() - 90
            if left > 60:
                bench(base, name, model=cfg["model"], key=key, shape=shape, out=out, limit=min(240, left))
            else:
                say(out, f"bench ({shape}): skipped, {left:.0f} s left before the deadline")
    except Exception as e:  # a failed check still stops vLLM and shows its log
        say(out, "check failed:", repr(e)[:500])
        ok = False
    # The role's stop: kill -TERM <vLLM's pid>, wait up to vllm_service_stop_timeout, then kill its group.
    t2 = time.time()
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT)
        stopped = f"exited rc={proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        stopped = "killed after SIGTERM timeout"
        ok = False
    took = time.time() - t2
    used = gpu_used()
    t3 = time.time()
    while isinstance(used, list) and max(used) > 1024 and time.time() - t3 < 30:
        time.sleep(1)
        used = gpu_used()
    freed = isinstance(used, list) and max(used) <= 1024
    say(out, f"stop (SIGTERM): vLLM {stopped} in {took:.1f} s; GPU MiB used {used} "
        f"({'free' if freed else 'NOT free'} {time.time() - t3:.1f} s after the exit)")  # fmt: skip
    ok &= freed
    cluster.status_until(f"{shape} after stop", f"0.0/{cluster.gpus}", 20)
    lines = (out / f"{shape}-vllm.log").read_text(errors="replace").splitlines()
    keys = [x for x in lines if any(k in x for k in LOG_KEYS)][:60]
    text = "\n".join(x[:400] for x in [*keys, "...", *lines[-20 if ok else -80 :]])
    say(out, f"--- vLLM log ({len(lines)} lines), key lines and tail:\n{text}")
    say(out, f"=== {shape}: {'PASS' if ok else 'FAIL'} (ready {ready:.1f} s)")
    return ok


def keep_ray_logs(out: Path) -> None:
    """Ray's own logs of the session (raylet, gcs, workers), for a failure's post-mortem; large files cut."""
    logs = Path("/tmp/ray/session_latest/logs")
    if not logs.is_dir():
        return
    with tarfile.open(out / "ray-session-logs.tar.gz", "w:gz") as tar:
        for f in sorted(logs.rglob("*")):
            if f.is_file() and f.stat().st_size < 4 << 20:
                tar.add(f, arcname=str(f.relative_to(logs)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rendered", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--deadline", type=float, default=540, help="seconds from start for everything")
    parser.add_argument("--ray-arg", action="append", default=[])
    parser.add_argument("--ray-only", action="store_true")
    a = parser.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    deadline = T0 + a.deadline
    cluster = Cluster(a.rendered / a.shapes[0], a.out, a.ray_arg)
    passed: list[bool] = []
    try:
        for node in cluster.nodes:
            say(
                a.out,
                f"--- {node}.ray.env (as rendered)\n{(cluster.rendered / f'{node}.ray.env').read_text()}",
            )
        cluster.start("head")
        up = cluster.wait_port()
        say(a.out, f"head GCS {cluster.address} answers: {up}")
        if "worker" in cluster.nodes:
            cluster.start("worker")
        probe = cluster.probe()
        ray_ok = bool(probe.get("alive")) and not probe.get("missing")
        say(
            a.out,
            f"ray_cluster probe (files/ray_nodes.py): {json.dumps(probe)}; {'PASS' if ray_ok else 'FAIL'}",
        )
        ray_ok &= f"/{cluster.gpus}" in cluster.status_until("every node up", f"/{cluster.gpus}")
        passed.append(ray_ok)
        if ray_ok and not a.ray_only:
            for shape in a.shapes:
                if deadline - time.time() < 150:
                    say(
                        a.out,
                        f"=== {shape}: skipped, {deadline - time.time():.0f} s left before the deadline",
                    )
                    passed.append(False)
                    continue
                passed.append(run_shape(cluster, a.rendered / shape, a.out, deadline))
    finally:
        cluster.stop()
        keep_ray_logs(a.out)
        say(a.out, "GPU MiB used at the end:", gpu_used(), f"; runner took {time.time() - T0:.0f} s")
        shutil.rmtree("/tmp/ray16-bench", ignore_errors=True)
    say(a.out, "RESULT:", "PASS" if all(passed) else "FAIL", passed)
    sys.exit(0 if all(passed) else 1)


if __name__ == "__main__":
    main()
