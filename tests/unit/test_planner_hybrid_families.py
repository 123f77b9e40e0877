"""The planner against H200 start-ups of vLLM 0.24.0 (issue 38, second round): AWQ on the H200 and the hybrid
families Falcon-H1 (Mamba-2 beside attention in every layer), Jamba (Mamba-1) and Qwen3-Next (gated DeltaNet).

Each case is one ``vllm serve --load-format dummy --enforce-eager`` start-up (tests/gpu/planner_run.py,
2026-12-02, nvidia-h200, driver 580.159.04, torch 2.11.0+cu130, transformers 5.17) whose DEBUG log is in
tests/unit/data/vllm_logs/v0.24_h200/; the configs are in tests/unit/data/planner_models/ (sources in
docs/planner.md). No constant was fitted on any of them.

CALIBRATION: the first start-up of each hybrid family, read while its rules (planner/hybrid.py) were written
from vLLM's code (its "Setting attention block size" line confirmed the state's dtype).
VALIDATION: predicted by the code of commit 3893408 before the start-up ran, and not changed after: both AWQ
start-ups (the rules of the H100, unchanged) and each hybrid family at another context length and memory
utilization.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.planner import GpuDevice, PlanRequest, plan
from gpufleet.planner.allocator import SharedSegments
from gpufleet.planner.arch import GIB, layer_params, parse_arch
from gpufleet.planner.hybrid import GatedDeltaNetShape, Mamba1Shape, MambaShape

from .test_planner_h200 import config, measured

DATA = Path(__file__).resolve().parent / "data"
LOGS = DATA / "vllm_logs" / "v0.24_h200"
MODELS = DATA / "planner_models"
H200 = GpuDevice(name="NVIDIA H200", memory_gib=150_109_880_320 / GIB)  # torch.cuda.mem_get_info() total
FALCON, JAMBA, QWEN3_NEXT = "Falcon-H1-0.5B-Instruct", "Jamba-v0.1-16L", "Qwen3-Next-80B-A3B-Instruct-24L"


def case(name: str, model: str, split: str, *marks: Any, **settings: Any) -> Any:
    item = {"name": name, "model": model, "split": split, "settings": settings}
    return pytest.param(item, id=name, marks=marks)


CALIBRATION = [
    case("falcon-h1-0.5b-hybrid", FALCON, "calibration", max_model_len=16384),
    case("jamba-v0.1-16l-hybrid", JAMBA, "calibration", max_model_len=32768),
    case("qwen3-next-24l-hybrid", QWEN3_NEXT, "calibration", max_model_len=32768),
]
VALIDATION = [
    case("qwen2.5-7b-awq-h200-eager", "Qwen2.5-7B-Instruct-AWQ", "validation", max_model_len=8192),
    case("qwen2.5-32b-awq-h200-eager", "Qwen2.5-32B-Instruct-AWQ", "validation", max_model_len=16384),
    case("falcon-h1-0.5b-hybrid-8k", FALCON, "validation", max_model_len=8192, gpu_memory_utilization=0.7),
    case("jamba-v0.1-16l-hybrid-64k", JAMBA, "validation", max_model_len=65536, gpu_memory_utilization=0.8),
    case(
        "qwen3-next-24l-hybrid-128k",
        QWEN3_NEXT,
        "validation",
        max_model_len=131072,
        gpu_memory_utilization=0.85,
    ),
]
ALL = CALIBRATION + VALIDATION


def predicted(item: dict[str, Any], **extra: Any) -> Any:
    settings = {"gpu_memory_utilization": 0.9, "enforce_eager": True} | item["settings"] | extra
    return plan(PlanRequest(hf_config=config(item["model"]), gpus=(H200,), **settings))


@pytest.mark.parametrize("item", ALL)
def test_every_start_up_log_is_vllm_024_with_the_figures(item: dict[str, Any]) -> None:
    facts = measured(item)
    assert facts.version == "0.24.0"
    assert facts.weights_gib and facts.kv_cache_tokens and facts.kv_cache_gib and facts.torch_peak_gib


@pytest.mark.parametrize("item", ALL)
def test_plans_without_refusal(item: dict[str, Any]) -> None:
    assert predicted(item).errors == []


@pytest.mark.parametrize("item", ALL)
def test_weights_within_1_percent(item: dict[str, Any]) -> None:
    assert predicted(item).weights_gib_per_gpu == pytest.approx(measured(item).weights_gib, rel=0.01)


def test_falcon_h1_small_tensors_share_allocator_segments() -> None:
    # Falcon-H1 0.5B's layers hold 1.5, 6.5, 3, 8 and 4 MiB tensors, cut from shared 20 MiB segments; where
    # a request leaves 1 MiB or less of a free block it keeps the whole block. Per tensor (cuda_block_bytes)
    # the weights were 0.977 GiB, 2.3 % under vLLM's 1.0 GiB (the prediction of commit 3893408).
    item = CALIBRATION[0].values[0]
    assert predicted(item).weights_gib_per_gpu == pytest.approx(1.002, abs=0.001)


def test_shared_segments_keep_a_block_that_leaves_a_mebibyte_or_less() -> None:
    mib = 2**20
    segments = SharedSegments()
    assert segments.block(8 * mib) == 8 * mib  # a new 20 MiB segment, split: 12 MiB left
    assert segments.block(12 * mib) == 12 * mib  # its own segment (10 MiB or more): the shared one untouched
    assert segments.block(6 * mib) == 6 * mib  # from the 12 MiB left: 6 MiB left
    assert segments.block(5 * mib + mib // 4) == 6 * mib  # 0.75 MiB would be left: the whole block
    assert segments.block(mib) == mib  # the small pool
    assert segments.block(2 * mib) == 2 * mib  # a new segment: nothing fits


@pytest.mark.parametrize("item", ALL)
def test_kv_cache_tokens_within_3_percent(item: dict[str, Any]) -> None:
    assert predicted(item).kv_cache_tokens == pytest.approx(measured(item).kv_cache_tokens, rel=0.03)


@pytest.mark.parametrize("item", ALL)
def test_kv_tokens_from_the_measured_kv_memory_are_exact(item: dict[str, Any]) -> None:
    # Given the KV memory vLLM printed, the layout gives the token count vLLM printed, up to the 0.01 GiB
    # rounding of the printed memory.
    facts = measured(item)
    assert facts.kv_cache_gib is not None
    result = predicted(item, kv_cache_memory_gib=facts.kv_cache_gib)
    assert result.kv_cache_tokens == pytest.approx(facts.kv_cache_tokens, rel=0.0005)


@pytest.mark.parametrize(
    ("name", "block", "padding", "groups"),
    [
        # 36 layers, each with attention and a Mamba-2 mixer: one attention group and one Mamba group of 36.
        ("falcon-h1-0.5b-hybrid", 800, "1.39", 2),
        # 2 attention layers (4 and 12) and 14 Mamba-1 layers: groups of 2, so 1 + 7.
        ("jamba-v0.1-16l-hybrid", 80, "5.26", 8),
        # 6 full-attention layers and 18 gated DeltaNet layers: groups of 6, so 1 + 3.
        ("qwen3-next-24l-hybrid", 544, "1.49", 4),
    ],
)
def test_hybrid_block_size_padding_and_groups_are_vllms(
    name: str, block: int, padding: str, groups: int
) -> None:
    log = (LOGS / f"{name}.log").read_text(encoding="utf-8")
    assert f"Setting attention block size to {block} tokens" in log
    assert f"Padding mamba page size by {padding}%" in log
    result = predicted(next(p.values[0] for p in CALIBRATION if p.id == name))
    assert result.block_size == block
    assert result.kv_cache_groups == groups


def test_state_of_each_family_is_mamba_utils() -> None:
    # MambaStateShapeCalculator, bfloat16 (mamba_cache_dtype auto), one rank.
    falcon = parse_arch(config(FALCON)).mamba
    assert isinstance(falcon, MambaShape)
    assert falcon.state_bytes(1, 2) == 3 * (1536 + 2 * 128) * 2 + 24 * 64 * 128 * 2  # 403,968
    jamba = parse_arch(config(JAMBA)).mamba
    assert isinstance(jamba, Mamba1Shape)
    assert jamba.state_bytes(1, 2) == 3 * 8192 * 2 + 8192 * 16 * 2  # 311,296
    gdn = parse_arch(config(QWEN3_NEXT)).mamba
    assert isinstance(gdn, GatedDeltaNetShape)
    assert gdn.state_bytes(1, 2) == 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 2  # 1,097,728
    assert gdn.state_bytes(2, 2) == gdn.state_bytes(1, 2) // 2


def test_falcon_h1_layers_hold_attention_and_mamba() -> None:
    arch = parse_arch(config(FALCON))
    assert all(
        arch.is_attention_layer(layer) and arch.is_state_layer(layer) for layer in range(arch.num_layers)
    )


def test_jamba_layers_follow_the_periods() -> None:
    arch = parse_arch(config(JAMBA))
    assert [layer for layer in range(16) if arch.is_attention_layer(layer)] == [4, 12]
    assert arch.moe is not None
    assert sorted(set(range(16)) - arch.moe.dense_layers) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert arch.rotary_caches == 0  # Jamba's attention has no positional embedding


def test_qwen3_next_gated_attention_and_shared_expert_gate() -> None:
    arch = parse_arch(config(QWEN3_NEXT))
    assert [layer for layer in range(24) if arch.is_attention_layer(layer)] == [3, 7, 11, 15, 19, 23]
    assert arch.attention_output_gate
    assert arch.moe is not None
    assert arch.moe.shared_expert_gate
    assert arch.rotary_dim == 64  # partial_rotary_factor 0.25 of 256


def test_awq_on_the_h200_uses_machete() -> None:
    for name in ("qwen2.5-7b-awq-h200-eager", "qwen2.5-32b-awq-h200-eager"):
        log = (LOGS / f"{name}.log").read_text(encoding="utf-8")
        assert "Using MacheteLinearKernel for AutoAWQMarlinLinearMethod" in log


ZAMBA2 = "Zamba2-Config-defaults"  # transformers' Zamba2Config defaults ("a Zamba2-2.7B style configuration")


def test_zamba2_layers_follow_zamba2_py() -> None:
    arch = parse_arch(config(ZAMBA2))
    kinds = [arch.layer_kind(layer) for layer in range(54)]
    # Nine hybrid layers (layers_block_type); the first also holds the one shared block (num_mem_blocks 1).
    assert kinds.count("zamba_hybrid_shared") == 1
    assert kinds.count("zamba_hybrid") == 8
    assert all(arch.is_state_layer(layer) for layer in range(54))  # a Mamba-2 layer everywhere
    # Attention over the concatenated 2 x hidden: 32 heads of 160, no GQA; lm_head tied to the embedding.
    assert (arch.head_dim, arch.num_kv_heads, arch.tie_embeddings) == (160, 32, True)
    shared = sum(p.out_features * max(p.in_features, 1) for p in layer_params(arch, 1, 6))
    plain = sum(p.out_features * max(p.in_features, 1) for p in layer_params(arch, 1, 12))  # hybrid, unshared
    hidden, inter = 2560, 10240
    block = 3 * 32 * 160 * 2 * hidden + hidden * 2 * hidden + 2 * inter * hidden + hidden * inter + 3 * hidden
    assert shared - plain == block
    # A hybrid layer adds to a Mamba layer its hidden x hidden linear and the MLP's LoRA adapter (rank 128).
    mamba = sum(p.out_features * max(p.in_features, 1) for p in layer_params(arch, 1, 11))
    assert plain - mamba == hidden * hidden + 128 * hidden + 2 * inter * 128


def test_zamba2_block_size_and_groups() -> None:
    result = plan(PlanRequest(hf_config=config(ZAMBA2), gpus=(H200,), max_model_len=4096))
    # Mamba state: conv 3 x (5120 + 2 x 64) x 2 + SSM 8 x 640 x 64 x 2 = 686,848 bytes; attention 20,480 bytes
    # per token: cdiv(686848, 16 x 20480) = 3 -> 48 tokens. 9 attention and 54 Mamba layers: groups of 9.
    assert result.block_size == 48
    assert result.kv_cache_groups == 1 + 6
    assert result.errors == []
