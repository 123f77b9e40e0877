"""Issue 38, third round: start-ups of models the planner learned on 2026-12-02, as VALIDATION cases.

The predictions in data/vllm_logs/v0.24_h200/predictions-round3.json were written by this planner and
committed before the start-ups ran (tests/gpu/planner_run.py, the cases of the same names: dummy weights,
``--enforce-eager``, TP 1, gpu_memory_utilization 0.9, on an H200 whose torch.cuda.mem_get_info() total is
150,109,880,320 B). The planner is not changed afterwards: a test here checks that it still predicts the
committed figures, and the start-up logs are compared with them (weights 1 %, KV tokens 3 %).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.planner import GpuDevice, PlanRequest, plan
from gpufleet.planner.arch import GIB

DATA = Path(__file__).resolve().parent / "data"
LOGS = DATA / "vllm_logs" / "v0.24_h200"
MODELS = DATA / "planner_models"
H200 = GpuDevice(name="NVIDIA H200", memory_gib=150_109_880_320 / GIB)
PREDICTIONS: dict[str, dict[str, Any]] = json.loads(
    (LOGS / "predictions-round3.json").read_text(encoding="utf-8")
)


def predict(case: dict[str, Any]) -> Any:
    hf = json.loads((MODELS / case["model"] / "config.json").read_text(encoding="utf-8"))
    return plan(PlanRequest(hf_config=hf, gpus=(H200,), **case["settings"]))


@pytest.mark.parametrize("name", sorted(PREDICTIONS))
def test_planner_still_predicts_the_committed_figures(name: str) -> None:
    case = PREDICTIONS[name]
    result = predict(case)
    assert result.errors == []
    assert result.weights_gib_per_gpu == pytest.approx(case["weights_gib"], abs=0.0005)
    assert result.kv_cache_tokens == case["kv_cache_tokens"]
