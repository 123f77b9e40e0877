"""Run the role's rendered mp-executor configs as two "nodes" on one 2-GPU machine (the device side).

For each shape (a folder of head.yaml/head.env/worker.yaml/worker.env rendered by render.sh), start
``vllm serve --config <node>.yaml`` once per node, as the role's control script does (environment from the
node's env file, like ``docker exec --env-file``), rank 0 on GPU 0 and rank 1 on GPU 1; wait until
GET /v1/models (with the key) lists the served model; send one chat completion with the key (expect 200)
and without it (expect 401); stop both with SIGTERM, as the role's stop does. The configs are used as
rendered; nothing in them is edited here.

Usage: python3 mp_runner.py RENDERED_DIR OUT_DIR SHAPE [SHAPE ...] (a shape after "--if-failed" runs only
when every shape before it failed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from subprocess import Popen

import yaml

VLLM = "import sys; sys.argv[0] = 'vllm'; from vllm.entrypoints.cli.main import main; main()"
READY_LIMIT = 240  # seconds for both ranks to come up
LOG_KEYS = (
    "non-default args", "headless", "world_size", "nnodes", "node_rank", "Loading weights took",
    "Model loading took", "KV cache", "Maximum concurrency", "init engine", "Starting vLLM API server",
    "Error", "Traceback", "rror:",
)  # fmt: skip


def say(out: Path, *parts: object) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    with (out / "summary.txt").open("a", encoding="utf-8") as f:
        f.write(line + "\n")


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines, as docker --env-file reads them (no quoting; # comments)."""
    pairs = (line.split("=", 1) for line in path.read_text(encoding="utf-8").splitlines() if "=" in line)
    return {k: v for k, v in pairs if not k.startswith("#")}


def http(url: str, key: str | None, body: dict | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def gpu_used() -> str:
    query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
    try:
        result = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return repr(e)
    return result.stdout.strip().replace("\n", "; ")


def start(node: str, shape_dir: Path, gpu: int, logs: Path) -> Popen:
    env = os.environ | env_file(shape_dir / f"{node}.env") | {"CUDA_VISIBLE_DEVICES": str(gpu)}
    cmd = [sys.executable, "-c", VLLM, "serve", "--config", str(shape_dir / f"{node}.yaml")]
    log = (logs / f"{shape_dir.name}-{node}.log").open("w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(procs: dict[str, Popen], timeout: float = 60) -> dict[str, str]:
    """SIGTERM to each rank's process group, then SIGKILL after timeout (the role's stop)."""
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + timeout
    result = {}
    for node, p in procs.items():
        try:
            p.wait(max(1, deadline - time.time()))
            result[node] = f"exited rc={p.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            result[node] = "killed after SIGTERM timeout"
    return result


def check(procs: dict[str, Popen], t0: float, *, base: str, key: str, name: str, out: Path) -> bool:
    """Ready = /v1/models (with the key) lists the model; then one chat with the key and one without."""
    listed = None
    while time.time() - t0 < READY_LIMIT and all(p.poll() is None for p in procs.values()):
        try:
            status, body = http(f"{base}/v1/models", key)
            if status == 200:
                listed = [m["id"] for m in json.loads(body)["data"]]
                break
        except OSError:
            pass
        time.sleep(1)
    say(out, f"ready after {time.time() - t0:.1f} s: models {listed}; exit codes",
        {n: p.poll() for n, p in procs.items()}, "; GPU MiB used:", gpu_used())  # fmt: skip
    if listed is None:
        return False
    messages = [{"role": "user", "content": "hello"}]
    chat = {"model": name, "messages": messages, "max_tokens": 8, "temperature": 0}
    t1 = time.time()
    with_key, body = http(f"{base}/v1/chat/completions", key, chat)
    took = time.time() - t1
    answer = json.loads(body)["choices"][0]["message"]["content"] if with_key == 200 else body[:300]
    without_key, body_nokey = http(f"{base}/v1/chat/completions", None, chat)
    models_nokey, _ = http(f"{base}/v1/models", None)
    say(out, f"chat with key: {with_key} in {took:.2f} s, answer {answer!r}")
    say(out, f"chat without key: {without_key} {body_nokey[:120]!r}")
    say(out, f"/v1/models without key: {models_nokey}")
    return listed == [name] and with_key == 200 and without_key == 401 and models_nokey == 401


def run_shape(shape_dir: Path, out: Path) -> bool:
    head = yaml.safe_load((shape_dir / "head.yaml").read_text(encoding="utf-8"))
    key = env_file(shape_dir / "head.env")["VLLM_API_KEY"]
    base = f"http://{head['host']}:{head['port']}"
    tp, pp = head["tensor-parallel-size"], head["pipeline-parallel-size"]
    say(out, f"=== {shape_dir.name}: TP {tp} x PP {pp}", base)
    for node in ("head", "worker"):
        rendered = (shape_dir / f"{node}.yaml").read_text(encoding="utf-8")
        say(out, f"--- {node}.yaml (as rendered)\n{rendered}")
    t0 = time.time()
    procs = {"head": start("head", shape_dir, 0, out), "worker": start("worker", shape_dir, 1, out)}
    try:
        ok = check(procs, t0, base=base, key=key, name=head["served-model-name"], out=out)
    except Exception as e:  # a failed check still stops both ranks and shows their logs
        say(out, "check failed:", repr(e)[:500])
        ok = False
    t2 = time.time()
    say(out, "stop:", stop(procs), f"in {time.time() - t2:.1f} s; GPU MiB used after:", gpu_used())
    for node in ("head", "worker"):
        lines = (out / f"{shape_dir.name}-{node}.log").read_text(errors="replace").splitlines()
        keys = [x for x in lines if any(k in x for k in LOG_KEYS)][:40]
        keep = [*keys, "...", *lines[-25 if ok else -60 :]]
        text = "\n".join(x[:400] for x in keep)
        say(out, f"--- {node} log ({len(lines)} lines), key lines and tail:\n{text}")
    say(out, f"=== {shape_dir.name}: {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> None:
    rendered, out, shapes = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    out.mkdir(parents=True, exist_ok=True)
    passed: list[bool] = []
    conditional = False
    for shape in shapes:
        if shape == "--if-failed":
            conditional = True
            continue
        if conditional and any(passed):
            say(out, f"=== {shape}: skipped (an earlier shape passed)")
            continue
        passed.append(run_shape(rendered / shape, out))
    sys.exit(0 if passed and all(passed) else 1)


if __name__ == "__main__":
    main()
