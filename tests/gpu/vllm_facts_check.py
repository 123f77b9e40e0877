"""The vllm_service role's ``gpufleet_vllm_facts`` on a real start-up log, against what the log itself says.

The facts come from the role's filter (``plugins/filter/gpufleet_vllm.py``), called as tasks/facts.yml calls
it: the log and ``vllm_service_block_size``, then served_model_name, and executor = ``vllm_service_executor``
(the inventory's setting, given as EXECUTOR), as the role does. "What the log says" is read here separately,
with plain string search on the lines vLLM 0.24 prints (not the filter's patterns): every fact the log states
must equal the filter's, and the facts the role's reports need must be there. ``ready_seconds`` (from the
log's own timestamps) must not exceed the runner's measured ready time, which also counts Python's start
before the first log line. Then which executor really served: Ray's when the log has vLLM's Ray worker actors
(``(RayWorkerProc pid=...)``, the V2 Ray executor of vLLM 0.24, or ``RayWorkerWrapper``, the older one) or
its Ray placement group lines. When head.yaml names ``distributed-executor-backend: ray`` they are required;
when it names none (world size 1: the role renders none) the line says whether the published ``executor``
fact matches what ran.

Runs on the GPU machine (PYTHONPATH with ansible-core and pydantic) or here (the repo's venv):
    python3 tests/gpu/vllm_facts_check.py VLLM_LOG HEAD_YAML RUNNER_READY_SECONDS EXECUTOR
Prints one JSON object per check and PASS/FAIL; exits 1 on FAIL.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "plugins" / "filter"), str(REPO / "src")]

import yaml  # noqa: E402
from gpufleet_vllm import gpufleet_vllm_facts  # noqa: E402

REQUIRED = ("version", "weights_gib", "kv_cache_gib", "kv_cache_tokens", "max_concurrency", "ready_seconds")


def after(line: str, marker: str) -> str | None:
    """The first word after ``marker`` in ``line``, or None."""
    _, found, rest = line.partition(marker)
    return rest.split()[0] if found and rest.split() else None


def number(text: str | None, strip: str = "") -> float | None:
    return float(text.rstrip(strip).replace(",", "")) if text else None


def from_log(lines: list[str]) -> dict[str, object]:
    """What the log states, by plain string search; the last line that says it (one GPU: one line each)."""
    said: dict[str, object] = {}
    for line in lines:
        if v := after(line, "LLM engine (v"):
            said["version"] = v.rstrip(")")
        if v := after(line, "Model loading took "):
            said["weights_gib"] = number(v)
            said["load_seconds"] = number(after(line, " GiB memory and ") or after(line, " GiB and "))
        if v := after(line, "Available KV cache memory: "):
            said["kv_cache_gib"] = number(v)
        if v := after(line, "GPU KV cache size: "):
            said["kv_cache_tokens"] = int(number(v) or 0)
            said["kv_cache_device"] = "GPU"
        if "Maximum concurrency for " in line and (v := after(line, "tokens per request: ")):
            said["max_concurrency"] = number(v, "x")
            said["max_concurrency_request_tokens"] = int(number(after(line, "Maximum concurrency for ")) or 0)
        if v := after(line, "init engine (profile, create kv cache, warmup model) took "):
            said["engine_init_seconds"] = number(v)
    return said


def main() -> None:
    log_path, config_path, runner_ready, executor = (
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        sys.argv[3],
        sys.argv[4],
    )
    cfg = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    text = log_path.read_text(encoding="utf-8", errors="replace")
    facts = gpufleet_vllm_facts(text, cfg["block-size"]) | {
        "served_model_name": cfg["served-model-name"],
        "executor": executor,
    }
    said = from_log(text.splitlines())
    print("gpufleet_vllm_facts:", json.dumps(facts))
    print("the log says:", json.dumps(said))
    ok = True
    for key, value in said.items():
        same = facts.get(key) == value
        ok &= same
        print(json.dumps({"fact": key, "filter": facts.get(key), "log": value, "equal": same}))
    missing = [key for key in REQUIRED if facts.get(key) is None]
    ok &= not missing
    print(json.dumps({"required facts missing": missing}))
    ready = facts["ready_seconds"]
    within = ready is not None and 0 < ready <= float(runner_ready)
    ok &= within
    print(json.dumps({"ready_seconds": ready, "runner measured": float(runner_ready), "within": within}))
    ray_lines = [x for x in text.splitlines() if "RayWorker" in x or "placement group" in x]
    backend = cfg.get("distributed-executor-backend")
    ran = "ray" if ray_lines else "vLLM's own (no Ray worker lines)"
    if backend == "ray":
        ok &= bool(ray_lines)
    first = ray_lines[0][:200] if ray_lines else None
    print(json.dumps({"head.yaml executor": backend, "ran": ran, "executor fact": executor,
                      "fact matches what ran": (executor == "ray") == bool(ray_lines),
                      "Ray lines": len(ray_lines), "first": first}))  # fmt: skip
    print("gpufleet_vllm_facts against the log:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
