"""Issue 38, third round: start-ups of models the planner learned on 2026-12-02, as VALIDATION cases.

The predictions in data/vllm_logs/v0.24_h200/predictions-round3.json were written by this planner and
committed before the start-ups ran (tests/gpu/planner_run.py, the cases of the same names: dummy weights,
``--enforce-eager``, TP 1, gpu_memory_utilization 0.9, on an H200 whose torch.cuda.mem_get_info() total is
150,109,880,320 B). The planner is not changed afterwards: a test here checks that it still predicts the
committed figures, and the start-up logs are compared with them (weights 1 %, KV tokens 3 %).

Run 2026-12-02 (nvidia-h200, driver 580.159.04, vLLM 0.24.0, torch 2.11.0+cu130, transformers 5.17): five
start-ups gave their figures; Phi-4-multimodal with images did not start (its Hugging Face processor is remote
code the machine cannot fetch, see ``test_phi4mm_with_images_did_not_start``), so its prediction is unchecked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet import vllm_log
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


STARTED = sorted(name for name in PREDICTIONS if name != "phi-4-mm-images")


def measured(name: str) -> vllm_log.VllmFacts:
    return vllm_log.parse((LOGS / f"{name}.log").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", STARTED)
def test_start_up_log_is_vllm_024_with_the_case_flags(name: str) -> None:
    facts = measured(name)
    assert facts.version == "0.24.0"
    assert facts.weights_gib and facts.kv_cache_tokens and facts.kv_cache_gib
    first = (LOGS / f"{name}.log").read_text(encoding="utf-8").splitlines()[0]
    assert "--max-model-len 16384 --gpu-memory-utilization 0.9 --enforce-eager" in first


@pytest.mark.parametrize("name", STARTED)
def test_committed_weights_within_1_percent(name: str) -> None:
    assert PREDICTIONS[name]["weights_gib"] == pytest.approx(measured(name).weights_gib, rel=0.01)


@pytest.mark.parametrize("name", STARTED)
def test_committed_kv_cache_tokens_within_3_percent(name: str) -> None:
    assert PREDICTIONS[name]["kv_cache_tokens"] == pytest.approx(measured(name).kv_cache_tokens, rel=0.03)


def test_nemotron_3_nano_block_size_and_padding_are_vllms() -> None:
    log = (LOGS / "nemotron-3-nano-30b-a3b-hybrid-moe.log").read_text(encoding="utf-8")
    assert "Setting attention block size to 2096 tokens" in log
    assert "Padding mamba page size by 0.58%" in log
    assert PREDICTIONS["nemotron-3-nano-30b-a3b-hybrid-moe"]["block_size"] == 2096


def test_phi4mm_with_images_did_not_start() -> None:
    # vLLM builds Phi-4-multimodal's processor from the checkpoint's remote code (processing_phi4mm.py);
    # the model directory had only the stand-in config class, so AutoProcessor gave the tokenizer back.
    log = (LOGS / "phi-4-mm-images.failed.log").read_text(encoding="utf-8")
    assert (
        "Invalid type of HuggingFace processor. Expected type: <class 'transformers.processing_utils" in log
    )
    assert "GPU KV cache size" not in log
