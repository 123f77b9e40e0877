"""Vision towers read from vLLM 0.24's code without a start-up to check them against (issue 38): Qwen3-VL
(qwen3_vl.py) and Mistral Small 3.x (mistral3.py with pixtral.py's Hugging Face-format tower).

The expected figures are counted here from the model files, parameter by parameter, on the published
configs (tests/unit/data/planner_models/, sources in docs/planner.md); they are not measurements.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.planner import GpuDevice, PlanRequest, plan
from gpufleet.planner.arch import GIB, parse_arch
from gpufleet.planner.multimodal import encoder_profile
from gpufleet.planner.towers import tower_tensors

MODELS = Path(__file__).resolve().parent / "data" / "planner_models"
H200 = GpuDevice(name="NVIDIA H200", memory_gib=150_109_880_320 / GIB)
NO_VISION = {"image": 0, "video": 0}
QWEN3_VL, MISTRAL3 = "Qwen3-VL-8B-Instruct", "Mistral-Small-3.1-24B-Instruct-2503"


def config(model: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MODELS / model / "config.json").read_text(encoding="utf-8"))
    return loaded


def planned(model: str, **settings: Any) -> Any:
    return plan(PlanRequest(hf_config=config(model), gpus=(H200,), max_model_len=32768, **settings))


def test_qwen3_vl_tower_is_counted_from_qwen3_vl_py() -> None:
    tower = parse_arch(config(QWEN3_VL)).vision
    assert tower is not None
    hidden, inter, merged = 1152, 4304, 1152 * 4
    block = 4 * hidden + (3 * hidden * hidden + 3 * hidden) + (hidden * hidden + hidden)
    block += (inter * hidden + inter) + (hidden * inter + hidden)
    merger = merged * merged + merged + 4096 * merged + 4096
    numel = hidden * 3 * 2 * 16 * 16 + hidden + 2304 * hidden + 8192 * 36  # patch (+bias), pos_embed, rotary
    numel += 27 * block + (2 * hidden + merger) + 3 * (2 * merged + merger)
    deepstack = 3 * 8192 * 4096  # deepstack_input_embeds: levels x max_num_batched_tokens x text hidden
    assert sum(tower_tensors(tower, 1, 2, batched_tokens=8192)) == (numel + deepstack) * 2


def test_qwen3_vl_without_images_leaves_the_tower_and_its_buffers_out() -> None:
    with_images = planned(QWEN3_VL)
    without = planned(QWEN3_VL, limit_mm_per_prompt=NO_VISION)
    assert without.vision_tower_gib_per_gpu == 0
    assert with_images.weights_gib_per_gpu - without.weights_gib_per_gpu == pytest.approx(
        with_images.vision_tower_gib_per_gpu
    )
    # The language model is Qwen3-8B's shape: q/k norms, bfloat16 from text_config's dtype, no warnings.
    assert without.dtype == "bfloat16"
    assert without.warnings == []
    assert parse_arch(config(QWEN3_VL)).qk_norm


def test_qwen3_vl_profiles_a_full_size_image() -> None:
    # Qwen3VLProcessingInfo: an image of 16,777,216 pixels in 32-pixel merged patches (16,384 tokens) beats a
    # two-frame video at 25,165,824 / 2 pixels (12,288); one item fills the budget of max(8192, 16384).
    tower = parse_arch(config(QWEN3_VL)).vision
    assert tower is not None
    profile = encoder_profile(tower, None, max_model_len=32768, batching=(8192, 1024), tp=1, dtype_bytes=2)
    assert profile is not None
    assert (profile.modality, profile.tokens_per_item, profile.budget, profile.items) == (
        "image",
        16384,
        16384,
        1,
    )
    # The cached output holds the three deepstack levels beside the merger's: 16384 x 4096 x 4 x 2 bytes.
    assert profile.outputs_bytes == 16384 * 4096 * 4 * 2


def test_mistral3_tower_is_counted_from_pixtral_py() -> None:
    tower = parse_arch(config(MISTRAL3)).vision
    assert tower is not None
    hidden, inter, text = 1024, 4096, 5120
    layer = 2 * hidden + 3 * 16 * 64 * hidden + hidden * 16 * 64 + 2 * inter * hidden + hidden * inter
    numel = hidden * 3 * 14 * 14 + hidden + 24 * layer  # patch_conv (no bias), ln_pre, blocks
    numel += hidden + 4 * hidden * hidden + hidden * text + text * text  # projector, no biases
    rotary = (1540 // 14) ** 2 * 64 * 4  # PixtralRotaryEmbedding's inv_freq, float32
    assert sum(tower_tensors(tower, 1, 2)) == numel * 2 + rotary


def test_mistral3_plans_and_profiles_a_full_size_image() -> None:
    result = planned(MISTRAL3)
    assert result.errors == []
    assert result.vision_tower_gib_per_gpu == pytest.approx(0.82, abs=0.01)
    # The language model: Mistral Small's 40 layers of 5120 (23.6 B parameters in bfloat16).
    assert result.weights_gib_per_gpu - result.vision_tower_gib_per_gpu == pytest.approx(43.94, abs=0.05)
    tower = parse_arch(config(MISTRAL3)).vision
    assert tower is not None
    profile = encoder_profile(tower, None, max_model_len=32768, batching=(8192, 1024), tp=1, dtype_bytes=2)
    assert profile is not None
    # PixtralHFEncoderInfo: ceil(1540 / (14 x 2))^2 merged patches; two images fill the 8192 budget.
    assert (profile.tokens_per_item, profile.items) == (3025, 2)


LLAMA4 = "Llama-4-Scout-17B-16E-Instruct"


def test_llama4_is_planned_with_a_generic_tower_and_a_margin_not_refused() -> None:
    # Two H200s (the 109 B model does not fit one): planned, with the tower estimated from vision_config and
    # a warning that names the margin.
    result = plan(
        PlanRequest(hf_config=config(LLAMA4), gpus=(H200, H200), tensor_parallel_size=2, max_model_len=131072)
    )
    assert result.errors == []
    margin = [warning for warning in result.warnings if "generic ViT" in warning]
    assert len(margin) == 1
    assert margin[0].startswith("architectures: Llama4ForConditionalGeneration: ")
    assert "Margin: keep 1.39 GiB per GPU free" in margin[0]
    # Counted from the published checkpoint's parameter table: 34 blocks of 23,807,872 parameters (q, k, v,
    # o with biases, fc1/fc2 with biases, two LayerNorms), halved over two ranks, in bfloat16.
    assert result.vision_tower_gib_per_gpu > 34 * 23_807_872 * 2 / 2 / GIB


def test_llama4_language_model_follows_llama4_py() -> None:
    arch = parse_arch(config(LLAMA4))
    assert arch.moe is not None
    # Every layer MoE (interleave_moe_layer_step 1), 16 experts of 8192 and one shared expert of 8192.
    assert (arch.moe.num_experts, arch.moe.intermediate_size, arch.moe.shared_intermediate_size) == (
        16,
        8192,
        8192,
    )
    assert not arch.moe.dense_layers
    # The RoPE layers use chunked local attention (8192-token chunks); every fourth layer (NoPE) is global.
    assert arch.layer_windows[:4] == (8192, 8192, 8192, None)
