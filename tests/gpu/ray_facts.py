"""Each shape's gpufleet_vllm_facts from the real vLLM log against `gpufleet plan` (runs here, not there).

For each shape: the vllm_service role's facts (the filter ``gpufleet_vllm_facts`` on the log of ``vllm
serve``, plus served_model_name and executor, as tasks/facts.yml publishes them), the planner's figures for
the rendered head.yaml's settings on the GPU the device reported, and gpufleet.vllm_log.compare's warnings.

Usage (the repo's venv): python tests/gpu/ray_facts.py OUT_DIR RENDERED_DIR GPU_MEMORY_GIB SHAPE...
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "filter"))

from gpufleet_vllm import gpufleet_vllm_facts  # noqa: E402

from gpufleet.vllm_log import VllmFacts, compare  # noqa: E402

CONFIG = REPO / "models" / "Qwen2.5-1.5B-Instruct" / "config.json"
PAIRS = (
    ("weights_gib", "weights_gib_per_gpu"),
    ("kv_cache_gib", "kv_cache_gib_per_gpu"),
    ("kv_cache_tokens", "kv_cache_tokens"),
    ("max_concurrency", "max_concurrency"),
)


def plan(cfg: dict, gpu_gib: str) -> dict:
    max_len = cfg.get("max-model-len") or json.loads(CONFIG.read_text())["max_position_embeddings"]
    cmd = [str(REPO / ".venv" / "bin" / "gpufleet"), "plan", "--json", "--model", str(CONFIG),
           "--gpu-name", "NVIDIA H200", "--gpu-memory-gib", gpu_gib, "--max-model-len", str(max_len),
           "--tensor-parallel-size", str(cfg["tensor-parallel-size"]),
           "--pipeline-parallel-size", str(cfg["pipeline-parallel-size"]),
           "--gpu-memory-utilization", str(cfg["gpu-memory-utilization"]),
           "--block-size", str(cfg["block-size"])]  # fmt: skip
    if cfg.get("enforce-eager"):
        cmd.append("--enforce-eager")
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=False).stdout)


def main() -> None:
    out, rendered, gpu_gib, shapes = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
    for shape in shapes:
        cfg = yaml.safe_load((rendered / shape / "head.yaml").read_text(encoding="utf-8"))
        log = (out / f"{shape}-vllm.log").read_text(encoding="utf-8", errors="replace")
        facts = gpufleet_vllm_facts(log, cfg["block-size"]) | {
            "served_model_name": cfg["served-model-name"],
            "executor": cfg["distributed-executor-backend"],
        }
        planned = plan(cfg, gpu_gib)
        print(f"=== {shape}: TP {cfg['tensor-parallel-size']} x PP {cfg['pipeline-parallel-size']}")
        print("gpufleet_vllm_facts:", json.dumps(facts))
        print("| fact | vLLM log | gpufleet plan | difference |\n| --- | --- | --- | --- |")
        for fact, key in PAIRS:
            measured, predicted = facts.get(fact), planned.get(key)
            diff = f"{(measured - predicted) / predicted:+.1%}" if measured is not None and predicted else "-"
            shown = predicted if predicted is None else round(predicted, 3)
            print(f"| {fact} | {measured} | {shown} | {diff} |")
        known = {k: v for k, v in facts.items() if k in VllmFacts.model_fields}
        warnings = compare(VllmFacts.model_validate(known), SimpleNamespace(**planned))
        print("compare (10 % tolerance):", warnings or "no warnings")
        print("planner errors/warnings:", planned.get("errors"), planned.get("warnings"))


if __name__ == "__main__":
    main()
