"""Published configs the planner had not seen (issue 38's held-out check), planned as vLLM 0.24 loads them.

vLLM reads config.json through transformers' config classes, so a key the file leaves out takes the class's
default; Gemma 3's published multimodal configs list only a few ``text_config`` keys (no ``vocab_size``,
heads, ``head_dim``, ...), and the planner refused them ("vocab_size: found None"). The configs are in
tests/unit/data/planner_models/ (sources in docs/planner.md); the figures are counted here, not measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.planner import GpuDevice, PlanRequest, plan
from gpufleet.planner.arch import GIB, parse_arch
from gpufleet.planner.base import PlannerUnmodelledError

MODELS = Path(__file__).resolve().parent / "data" / "planner_models"
H200 = GpuDevice(name="NVIDIA H200", memory_gib=150_109_880_320 / GIB)
NO_VISION = {"image": 0, "video": 0}
# The keys of gemma-3-4b-it's text_config that its published config.json leaves to Gemma3TextConfig
# (the bundled copy has them written out).
GEMMA3_DEFAULTED = (
    "head_dim",
    "hidden_activation",
    "max_position_embeddings",
    "num_attention_heads",
    "num_key_value_heads",
    "query_pre_attn_scalar",
    "rms_norm_eps",
    "rope_local_base_freq",
    "rope_theta",
    "sliding_window_pattern",
    "vocab_size",
)


def config(model: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MODELS / model / "config.json").read_text(encoding="utf-8"))
    return loaded


def planned(hf_config: dict[str, Any], **settings: Any) -> Any:
    return plan(PlanRequest(hf_config=hf_config, gpus=(H200,), max_model_len=32768, **settings))


def test_gemma3_published_text_config_takes_gemma3_text_config_defaults() -> None:
    explicit = config("gemma-3-4b-it")
    published = json.loads(json.dumps(explicit))
    for key in GEMMA3_DEFAULTED:
        del published["text_config"][key]
    assert planned(published) == planned(explicit)
    assert parse_arch(published) == parse_arch(explicit)


def test_gemma3_27b_published_config_is_planned() -> None:
    hf = config("gemma-3-27b-it")
    arch = parse_arch(hf)
    assert (arch.vocab_size, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (262_208, 32, 16, 128)
    assert arch.tie_embeddings
    # 62 layers, every sixth global, the others 1024-token windows (sliding_window_pattern 6).
    assert [window is None for window in arch.layer_windows] == [(layer + 1) % 6 == 0 for layer in range(62)]
    text_only = planned(hf, limit_mm_per_prompt=NO_VISION)
    assert text_only.errors == []
    hidden, inter, layers = 5376, 21504, 62
    layer = hidden * (32 * 128 + 2 * 16 * 128) + 32 * 128 * hidden + 3 * hidden * inter + 4 * hidden + 2 * 128
    params = 262_208 * hidden + layers * layer + hidden  # tied lm_head, final norm
    assert text_only.weights_gib_per_gpu == pytest.approx(params * 2 / GIB, rel=0.01)
    with_images = planned(hf)
    assert with_images.errors == []
    assert with_images.vision_tower_gib_per_gpu > 0.7  # SigLIP-400M and the projector


def test_pixtral_12b_vision_config_takes_pixtral_vision_config_defaults() -> None:
    # mistral-community/pixtral-12b's vision_config leaves the tower's sizes to PixtralVisionConfig; the
    # planner refused it as "a vision_config without the ViT's sizes".
    published = config("pixtral-12b")
    explicit = json.loads(json.dumps(published))
    explicit["vision_config"].update(
        {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16}
    )
    assert parse_arch(published) == parse_arch(explicit)
    result = planned(published)
    assert result == planned(explicit)
    assert result.errors == []
    assert any("generic ViT" in warning for warning in result.warnings)
    text_only = planned(published, limit_mm_per_prompt=NO_VISION)
    hidden, inter, layers, vocab = 5120, 14336, 40, 131072
    layer = hidden * (32 * 128 + 2 * 8 * 128) + 32 * 128 * hidden + 3 * hidden * inter + 2 * hidden
    params = 2 * vocab * hidden + layers * layer + hidden
    params += 1_024_000 * 128  # the rotary cos/sin cache: max_position_embeddings x head_dim (get_rope)
    assert text_only.weights_gib_per_gpu == pytest.approx(params * 2 / GIB, rel=0.01)
    # The tower: 24 blocks of about 12.6 M parameters (q/k/v/o and a two-layer MLP of 4096) in bfloat16.
    assert result.vision_tower_gib_per_gpu == pytest.approx(24 * 12.6e6 * 2 / GIB, rel=0.15)


# Held-out configs (sources in docs/planner.md): tensor-parallel size that fits an H200, and the model card's
# parameter count in billions (language model, towers and all; vLLM's loaded weights include buffers such as
# rotary caches, so the band is the 5 %).
PUBLISHED_PARAMS: dict[str, tuple[int, float]] = {
    "Nemotron-H-8B-Base-8K": (1, 8.1),
    "granite-4.0-h-small": (1, 32.2),
    "Zamba2-7B-original-format": (1, 7.4),
    "AI21-Jamba-Mini-1.7": (1, 51.6),
    "Qwen3-Next-80B-A3B-Thinking": (2, 81.3),
    "Qwen2.5-VL-3B-Instruct": (1, 3.75),
    "Qwen3-VL-30B-A3B-Instruct": (1, 31.1),
    "gemma-3-27b-it": (1, 27.4),
    "pixtral-12b": (1, 12.7),
    "Llama-4-Maverick-17B-128E-Instruct": (8, 402.0),
    "InternVL3-8B": (1, 7.94),
    "Kimi-VL-A3B-Instruct": (1, 16.4),
    "GLM-4.1V-9B-Thinking": (1, 10.3),
    "Idefics3-8B-Llama3": (1, 8.46),
    "llava-onevision-qwen2-7b-ov-hf": (1, 8.03),
    "NVIDIA-Nemotron-3-Nano-30B-A3B": (1, 31.6),
    "Qwen2-VL-7B-Instruct": (1, 8.29),
}
QUANTIZED = (
    "Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    "Meta-Llama-3.1-8B-Instruct-quantized.w4a16",
    "Qwen2.5-72B-Instruct-AWQ",
)


@pytest.mark.parametrize("model", sorted(PUBLISHED_PARAMS))
def test_held_out_model_is_planned_near_its_parameter_count(model: str) -> None:
    tp, billions = PUBLISHED_PARAMS[model]
    hf = config(model)
    length = min(32768, int(hf.get("max_position_embeddings") or 32768))
    result = plan(PlanRequest(hf_config=hf, gpus=(H200,) * tp, tensor_parallel_size=tp, max_model_len=length))
    assert result.errors == []
    assert result.kv_cache_tokens > 0
    dtype_bytes = 2  # every one is a bfloat16 or float16 checkpoint
    assert result.weights_gib_per_gpu * tp * GIB / dtype_bytes / 1e9 == pytest.approx(billions, rel=0.05)


@pytest.mark.parametrize("model", QUANTIZED)
def test_held_out_quantized_model_is_planned_at_about_four_bits(model: str) -> None:
    result = planned(config(model))
    dense = planned({**config(model), "quantization_config": None, "torch_dtype": "bfloat16"})
    assert result.errors == []
    # 4-bit weights with group scales; the embeddings, lm_head and norms stay in 16 bits.
    assert 0.25 < result.weights_gib_per_gpu / dense.weights_gib_per_gpu < 0.4


# Phi-4-multimodal's towers as vLLM 0.24 builds them (phi4mm.py, idefics2_vision_model.py, phi4mm_audio.py):
# the SigLIP-so400m image encoder cut to 26 layers (layer_idx -2, no post LayerNorm) with glb_GN, sub_GN and
# a two-layer projection; the 24-block Conformer with its NeMo front end, T5 biases, mean/variance parameters
# and two projection MLPs (466,416,416 parameters counted on the meta device from vLLM's own classes).
PHI4MM_HIDDEN = 3072
PHI4MM_IMAGE = (
    1152 * 3 * 14 * 14
    + 1152
    + 1024 * 1152  # patch embedding (bias), position embedding
    + 26 * (4 * 1152 + 3 * 1152 * 1152 + 3 * 1152 + 1152 * 1152 + 1152 + 2 * 4304 * 1152 + 4304 + 1152)
    + 2 * 1152  # glb_GN, sub_GN
    + 1152 * PHI4MM_HIDDEN
    + PHI4MM_HIDDEN
    + PHI4MM_HIDDEN**2
    + PHI4MM_HIDDEN  # img_projection
)
PHI4MM_AUDIO = 466_416_416
PHI4MM_NONE = {"image": 0, "video": 0, "audio": 0}


def test_phi4_multimodal_counts_its_towers() -> None:
    hf = config("Phi-4-multimodal-instruct")
    lm_only = planned(hf, limit_mm_per_prompt=PHI4MM_NONE)
    assert lm_only.errors == []
    assert lm_only.vision_tower_gib_per_gpu == 0
    result = planned(hf)
    assert result.errors == []
    towers = (PHI4MM_IMAGE + PHI4MM_AUDIO) * 2 / GIB
    assert result.vision_tower_gib_per_gpu == pytest.approx(towers, rel=1e-4)
    assert result.weights_gib_per_gpu - lm_only.weights_gib_per_gpu == pytest.approx(towers, rel=1e-4)
    # 3.84 B language model + 0.41 B image + 0.47 B audio; the card's 5.6 B adds the vision and speech LoRA
    # adapters (r 256 and 320 on every layer, about 0.83 B), which load_weights skips (skip_substrs "lora").
    assert result.weights_gib_per_gpu * GIB / 2 / 1e9 == pytest.approx(4.71, rel=0.02)
    # video is not a Phi-4-multimodal modality: unset, its limit stays 999 and the image encoder is built.
    image_only = planned(hf, limit_mm_per_prompt={"image": 0, "audio": 0})
    assert image_only.vision_tower_gib_per_gpu == pytest.approx(PHI4MM_IMAGE * 2 / GIB, rel=1e-4)
    audio_only = planned(hf, limit_mm_per_prompt={"image": 0, "video": 0})
    assert audio_only.vision_tower_gib_per_gpu == pytest.approx(PHI4MM_AUDIO * 2 / GIB, rel=1e-4)
    # At TP 2 the image encoder's layers are sharded; its embeddings, projection and the audio tower are not.
    tp2 = plan(PlanRequest(hf_config=hf, gpus=(H200,) * 2, tensor_parallel_size=2, max_model_len=32768))
    layers = 26 * (3 * 1152 * 1152 + 3 * 1152 + 1152 * 1152 + 2 * 4304 * 1152 + 4304)
    assert tp2.vision_tower_gib_per_gpu == pytest.approx(towers - layers / 2 * 2 / GIB, rel=1e-4)


def test_phi4_multimodal_unmodelled_conformer_is_refused() -> None:
    hf = config("Phi-4-multimodal-instruct")
    hf["embd_layer"]["audio_embd_layer"]["use_qformer"] = True
    with pytest.raises(PlannerUnmodelledError, match="audio_embd_layer"):
        parse_arch(hf)


def test_qwen2_vl_generic_tower_is_embed_dim_wide() -> None:
    # Qwen2VLVisionConfig: embed_dim (1280) is the tower's width and mlp_ratio its MLP's; hidden_size (3584)
    # is the patch merger's output, the language model's width. Read as the width, it gave a 9.25 GiB tower.
    hf = config("Qwen2-VL-7B-Instruct")
    tower = parse_arch(hf).vision
    assert tower is not None
    assert (tower.hidden_size, tower.intermediate_size, tower.layers) == (1280, 5120, 32)
    # qwen2_vl.py: the bias-free Conv3d patch embedding, 32 blocks (two LayerNorms, qkv and proj, fc1 and
    # fc2 of 5120, all with biases), the merger (LayerNorm, 5120 -> 5120 -> 3584); about 0.68 B parameters.
    width, inter = 1280, 5120
    block = 4 * width + (3 * width * width + 3 * width) + (width * width + width)
    block += (inter * width + inter) + (width * inter + width)
    merger = 2 * width + (4 * width) ** 2 + 4 * width + 4 * width * 3584 + 3584
    numel = 3 * 2 * 14 * 14 * width + 32 * block + merger
    assert planned(hf).vision_tower_gib_per_gpu == pytest.approx(numel * 2 / GIB, rel=0.15)


def test_nemotron_3_nano_moe_blocks_are_planned_from_nemotron_h_py() -> None:
    # NVIDIA-Nemotron-3-Nano-30B-A3B: 23 Mamba-2 (M), 23 MoE (E) and 6 attention (*) blocks. The planner
    # refused the E blocks as unmodelled; vLLM 0.24 builds them (nemotron_h.py, NemotronHMoE): a float32
    # router and its float32 e_score_correction_bias, 128 ungated relu2 experts (is_act_and_mul=False: w13
    # is the up projection alone) and a bias-free shared NemotronHMLP of 3712, one RMSNorm per block.
    hf = config("NVIDIA-Nemotron-3-Nano-30B-A3B")
    hidden, experts, inter, shared = 2688, 128, 1856, 3712
    moe = experts * 2 * inter * hidden + 2 * shared * hidden + hidden  # experts, shared expert, norm
    moe_fp32 = experts * hidden + experts  # router weight and score bias, 4 bytes each
    conv = 4096 + 2 * 8 * 128
    mamba = hidden * (2 * 4096 + 2 * 8 * 128 + 64) + conv * 4 + conv + 3 * 64 + 4096 + 4096 * hidden + hidden
    attention = hidden * (32 * 128 + 2 * 2 * 128) + 32 * 128 * hidden + hidden
    numel = 2 * 131_072 * hidden + 23 * (moe + mamba) + 6 * attention + hidden
    result = planned(hf)
    assert result.errors == []
    assert result.weights_gib_per_gpu == pytest.approx((numel * 2 + moe_fp32 * 23 * 4) / GIB, rel=0.01)
    assert result.weights_gib_per_gpu * GIB / 2 / 1e9 == pytest.approx(31.6, rel=0.02)  # the card's count
    # The Mamba state (float32 SSM state) sets the attention block as for the dense Nemotron-H blocks.
    state = 3 * conv * 2 + 64 * 64 * 128 * 4
    assert result.block_size == 16 * -(-state // (16 * 2 * 2 * 128 * 2))
    assert result.kv_cache_tokens > 0


def test_nemotron_h_latent_moe_is_still_refused() -> None:
    hf = {**config("NVIDIA-Nemotron-3-Nano-30B-A3B"), "moe_latent_size": 1024}
    with pytest.raises(PlannerUnmodelledError, match="latent MoE"):
        parse_arch(hf)


def test_phi4_multimodal_refuses_pipeline_parallel() -> None:
    # phi4mm.py: assert get_pp_group().world_size == 1, "pipeline parallel is not supported"
    hf = config("Phi-4-multimodal-instruct")
    result = plan(PlanRequest(hf_config=hf, gpus=(H200,) * 2, pipeline_parallel_size=2, max_model_len=32768))
    assert any("pipeline parallel is not supported" in error for error in result.errors)
