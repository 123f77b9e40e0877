"""The planner against start-ups of real vLLM 0.24.0 on an H200 (issue 38): hybrid, multimodal, MXFP4.

Each case is one ``vllm serve --load-format dummy`` start-up (tests/gpu/planner_run.py, 2026-12-02,
nvidia-h200, driver 580.159.04, torch 2.11.0+cu130) whose DEBUG log is kept in
tests/unit/data/vllm_logs/v0.24_h200/ and read with :mod:`gpufleet.vllm_log`; the config.json is in
tests/unit/data/planner_models/ (written from the published figures, see docs/planner.md). No constant was
fitted on any of them.

CALIBRATION: start-ups seen while the rule they check was written: the Qwen2.5-VL and Gemma 3 runs with images
(the encoder part of the profile run, ``multimodal.encoder_profile``) and Gemma 3 without images (its local
rotary cache, found from the weights figure of both Gemma runs).
VALIDATION: predicted by the code as it stood before the start-up was read, and not changed after: Nemotron-H
(hybrid Mamba-2), Qwen2.5-VL without its tower, gpt-oss-120b (MXFP4 on the H200).
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
H200 = GpuDevice(name="NVIDIA H200", memory_gib=150_109_880_320 / GIB)  # torch.cuda.mem_get_info() total
NO_VISION = {"image": 0, "video": 0}


def case(name: str, model: str, split: str, **settings: Any) -> Any:
    return pytest.param({"name": name, "model": model, "split": split, "settings": settings}, id=name)


CALIBRATION = [
    case("qwen2.5-vl-7b-images", "Qwen2.5-VL-7B-Instruct", "calibration", max_model_len=32768),
    case("gemma-3-4b-images", "gemma-3-4b-it", "calibration", max_model_len=32768),
    case(
        "gemma-3-4b-text-only",
        "gemma-3-4b-it",
        "calibration",
        max_model_len=32768,
        limit_mm_per_prompt={"image": 0},
    ),
]
VALIDATION = [
    case(
        "nemotron-nano-9b-v2-hybrid",
        "NVIDIA-Nemotron-Nano-9B-v2",
        "validation",
        max_model_len=32768,
        enforce_eager=True,
    ),
    case(
        "qwen2.5-vl-7b-text-only",
        "Qwen2.5-VL-7B-Instruct",
        "validation",
        max_model_len=32768,
        limit_mm_per_prompt=NO_VISION,
    ),
    case("gpt-oss-120b-mxfp4", "gpt-oss-120b", "validation", max_model_len=32768),
]
ALL = CALIBRATION + VALIDATION


def config(model: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MODELS / model / "config.json").read_text(encoding="utf-8"))
    return loaded


def measured(item: dict[str, Any]) -> vllm_log.VllmFacts:
    return vllm_log.parse((LOGS / f"{item['name']}.log").read_text(encoding="utf-8"))


def predicted(item: dict[str, Any], **extra: Any) -> Any:
    settings = {"gpu_memory_utilization": 0.9} | item["settings"] | extra
    return plan(PlanRequest(hf_config=config(item["model"]), gpus=(H200,), **settings))


@pytest.mark.parametrize("item", ALL)
def test_every_start_up_log_is_vllm_024_with_the_figures(item: dict[str, Any]) -> None:
    facts = measured(item)
    assert facts.version == "0.24.0"
    assert facts.weights_gib and facts.kv_cache_tokens and facts.kv_cache_gib and facts.torch_peak_gib


@pytest.mark.parametrize("item", ALL)
def test_plans_without_refusal(item: dict[str, Any]) -> None:
    result = predicted(item)
    assert result.errors == []
    assert result.vllm_version == "0.24.0"


@pytest.mark.parametrize("item", ALL)
def test_weights_within_1_percent(item: dict[str, Any]) -> None:
    assert predicted(item).weights_gib_per_gpu == pytest.approx(measured(item).weights_gib, rel=0.01)


@pytest.mark.parametrize("item", ALL)
def test_kv_cache_tokens_within_3_percent(item: dict[str, Any]) -> None:
    assert predicted(item).kv_cache_tokens == pytest.approx(measured(item).kv_cache_tokens, rel=0.03)


@pytest.mark.parametrize("item", ALL)
def test_kv_tokens_from_the_measured_kv_memory_are_exact(item: dict[str, Any]) -> None:
    # Given the KV memory vLLM printed, the layout (hybrid block size, Mamba groups, sliding windows) gives
    # the token count vLLM printed, up to the 0.01 GiB rounding of the printed memory.
    facts = measured(item)
    assert facts.kv_cache_gib is not None
    result = predicted(item, kv_cache_memory_gib=facts.kv_cache_gib)
    assert result.kv_cache_tokens == pytest.approx(facts.kv_cache_tokens, rel=0.0005)


def test_hybrid_block_size_and_padding_are_vllms() -> None:
    # vLLM logged "Setting attention block size to 1312 tokens" and "Padding mamba page size by 1.08%".
    log = (LOGS / "nemotron-nano-9b-v2-hybrid.log").read_text(encoding="utf-8")
    assert "Setting attention block size to 1312 tokens" in log
    assert "Padding mamba page size by 1.08%" in log
    result = predicted(VALIDATION[0].values[0])
    assert result.block_size == 1312
    # 4 attention layers, 27 Mamba layers: groups of 4, so 1 attention group and 7 Mamba groups.
    assert result.kv_cache_groups == 8
    # The Mamba state: conv (3 x 12288 x 2 bytes) + SSM (128 heads x 80 x 128 x float32) = 5,316,608 bytes,
    # padded to the attention page of 1312 tokens x 4096 bytes.
    page = 1312 * 2 * 8 * 128 * 2
    assert round((page / 5_316_608 - 1) * 100, 2) == 1.08
    assert result.kv_bytes_per_token_per_gpu == page * 4 // 1312


def test_hybrid_is_not_planned_as_a_dense_decoder() -> None:
    # The old planner counted every block as attention + MLP (about 3x the weights) and 56 KV layers.
    result = predicted(VALIDATION[0].values[0])
    assert result.weights_gib_per_gpu < 17
    assert result.kv_cache_tokens > 5_000_000
    assert not any("Llama-style" in warning for warning in result.warnings)


def test_vision_tower_is_what_the_limits_leave_out() -> None:
    with_images = predicted(CALIBRATION[0].values[0])
    without = predicted(VALIDATION[1].values[0])
    assert without.vision_tower_gib_per_gpu == 0
    # Measured: 15.67 GiB with the tower, 14.4 GiB without: the tower is 1.27 GiB.
    assert with_images.vision_tower_gib_per_gpu == pytest.approx(15.67 - 14.4, abs=0.02)
    assert with_images.weights_gib_per_gpu - without.weights_gib_per_gpu == pytest.approx(
        with_images.vision_tower_gib_per_gpu
    )
    # A modality left out keeps vLLM's default of 999: the tower is built.
    assert predicted(CALIBRATION[0].values[0], limit_mm_per_prompt={"image": 0}).vision_tower_gib_per_gpu > 0


def test_encoder_profile_is_the_one_vllm_logged() -> None:
    from gpufleet.planner.arch import parse_arch
    from gpufleet.planner.multimodal import encoder_profile

    for name, model, modality, budget, items in (
        ("qwen2.5-vl-7b-images", "Qwen2.5-VL-7B-Instruct", "video", 32768, 1),
        ("gemma-3-4b-images", "gemma-3-4b-it", "image", 8192, 32),
    ):
        log = (LOGS / f"{name}.log").read_text(encoding="utf-8")
        assert (
            f"Encoder cache will be initialized with a budget of {budget} tokens, and profiled with "
            f"{items} {modality} items of the maximum feature size." in log
        )
        tower = parse_arch(config(model)).vision
        assert tower is not None
        profile = encoder_profile(
            tower, None, max_model_len=32768, batching=(8192, 1024), tp=1, dtype_bytes=2
        )
        assert profile is not None
        assert (profile.modality, profile.budget, profile.items) == (modality, budget, items)
    tower = parse_arch(config("gemma-3-4b-it")).vision
    assert tower is not None
    assert (
        encoder_profile(tower, {"image": 0}, max_model_len=32768, batching=(8192, 1024), tp=1, dtype_bytes=2)
        is None
    )


def test_gemma3_local_rotary_cache_is_not_scaled() -> None:
    # LinearScalingRotaryEmbedding builds max_position x factor (131072 x 8) positions for the global layers;
    # the local layers' cache is max_position_embeddings long: 512 + 64 MiB of bfloat16 x 256.
    result = predicted(CALIBRATION[2].values[0])
    assert result.stages[0].other_gib * GIB == pytest.approx((131072 * 8 + 131072) * 256 * 2, rel=0.001)


@pytest.mark.parametrize("item", CALIBRATION[:2])
def test_activation_peak_with_the_encoder_phase(item: dict[str, Any]) -> None:
    # The profile run's peak with images: the encoder's dummy forward (Qwen2.5-VL: one video of 32768 tokens,
    # 131072 patches) or the language model's batch with the encoder outputs held (Gemma 3). Measured 4.43 and
    # 3.89 GiB; the language model alone is 2.21 and 3.71 GiB.
    facts = measured(item)
    assert facts.torch_peak_gib is not None
    assert predicted(item).activation_peak_gib == pytest.approx(facts.torch_peak_gib, abs=0.25)
