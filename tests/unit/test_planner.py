"""The vLLM memory planner against real vLLM start-up figures, and its rules on synthetic configs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.fleet import plan_request_for_inventory
from gpufleet.planner import (
    GpuDevice,
    Plan,
    PlannerInputError,
    PlanRequest,
    kv_cache_capacity,
    load_model_config,
    plan,
)
from gpufleet.planner.allocator import cuda_block_bytes
from gpufleet.planner.arch import (
    GIB,
    Quantization,
    is_nvidia,
    param_bytes,
    param_tensors,
    parse_arch,
    pp_layer_split,
)
from gpufleet.planner.base import Param

DATA = Path(__file__).resolve().parents[1] / "data"
REPO = Path(__file__).resolve().parents[2]
SETTINGS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "block_size",
    "dtype",
    "quantization",
    "cpu_offload_gb",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enforce_eager",
)

# Llama-3.2-1B's public config.json (the fields the planner reads), and what vLLM 0.10.1 (V1) printed for
# it in a public log (tests/unit/data/vllm_logs/v0.10.1_v1_debug_full.log): a second model family, with
# tied embeddings and llama3 RoPE, beside the shared cases.
LLAMA_3_2_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 32.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
LLAMA_CASE: dict[str, Any] = {
    "name": "llama-3.2-1b-v0.10.1-public-log",
    "hf_config": LLAMA_3_2_1B,
    "gpu_total_gib": 39.88 / 0.9,  # "Requested memory: 0.90 (util), 39.88 GiB"
    "gpu_memory_utilization": 0.9,
    "tensor_parallel_size": 1,
    "max_model_len": 131072,
    "block_size": 16,
    "measured": {
        "weights_gib_per_gpu": 2.3185,
        "kv_cache_gib": 37.10,
        "kv_cache_blocks": 75972,
        "max_concurrency": 9.27,
    },
}
CASES: list[dict[str, Any]] = [*yaml.safe_load((DATA / "planner_cases.yml").read_text()), LLAMA_CASE]

# The cases vLLM 0.24 measured on an H100 plan on that GPU's CUDA name, so that the planner counts each tensor
# as the caching-allocator block it holds (cuda_block_bytes): Qwen2.5-1.5B's 2.98 GiB is 2.88 GiB of
# parameters and rotary cache plus 92 MiB of blocks rounded up to 2 MiB (its gate_up and down projections,
# 52.5 and 26.25 MiB per layer, are over the 20 MiB max_split_size vLLM 0.24 loads under). The older cases
# (vLLM 0.7.2 and 0.8.5, which loaded without that setting) keep a name that places no platform.
GPU_NAMES = {
    "qwen3-8b-h100-v2-runner": "NVIDIA H100 80GB HBM3",
    "qwen2.5-1.5b-h100-v1-runner": "NVIDIA H100 80GB HBM3",
}
# Weights are computed, so the tolerance is tight: 1 % for every case but one. The bitsandbytes case's
# 1.2216 GiB is below what Qwen3-8B can weigh at TP=2 in 4-bit (the packed linear layers alone are 1.62 GiB
# per rank, the bf16 embedding and unquantized lm_head 1.16 GiB); it is within 2 % of Qwen3-4B's shapes at
# TP=2. It stays an expected failure until the case is re-measured.
WEIGHT_TOLERANCE: dict[str, float] = {}
WEIGHT_XFAIL = {
    "qwen3-8b-tp2-bitsandbytes": "measured weights are below Qwen3-8B's 4-bit minimum; they fit Qwen3-4B"
}
# The KV cache rests on three estimates (activation peak, non-torch memory, CUDA graphs) that vLLM
# measures; their terms follow vLLM 0.24's profile run (gpufleet.planner.estimates). Every shared case
# lands within 3 % of the tokens vLLM reported but one from vLLM 0.8.5 (below).
KV_BOUND = 0.03
# vLLM 0.8.5's V1 engine counted the CUDA context as non-torch memory (about 1 GiB more with TP=2) and the
# planner models vLLM 0.24: this older case keeps a wider bound.
KV_BOUND_EXCEPTIONS = {"qwen3-8b-tp2-rtx3080-cpu-offload": 0.15}


def _case_config(case: dict[str, Any]) -> dict[str, Any]:
    return case.get("hf_config") or load_model_config(DATA / case["model"])


def request_for(case: dict[str, Any], **overrides: Any) -> PlanRequest:
    settings = {key: case[key] for key in SETTINGS if key in case} | overrides
    name = GPU_NAMES.get(case["name"], "GPU under test")
    gpu = GpuDevice(name=name, memory_gib=case.get("gpu_total_gib", 80.0))
    return PlanRequest(hf_config=_case_config(case), gpus=(gpu,), **settings)


def cases_with(*keys: str) -> list[Any]:
    return [
        pytest.param(case, id=case["name"])
        for case in CASES
        if all(key in case or key in case["measured"] for key in keys)
    ]


def measured_tokens(case: dict[str, Any]) -> int:
    measured = case["measured"]
    return int(measured.get("kv_cache_tokens") or measured["kv_cache_blocks"] * case.get("block_size", 16))


def measured_kv_gib(case: dict[str, Any]) -> float:
    """The smallest rank's KV cache as vLLM printed it (GiB rounded to 0.01)."""
    measured = case["measured"]
    if "ranks" in measured:
        return float(min(rank["kv_cache_gib"] for rank in measured["ranks"]))
    return float(measured["kv_cache_gib"])


# --- The shared cases: what vLLM printed ---------------------------------------------------------------


def _weight_params() -> list[Any]:
    params = []
    for case in CASES:
        if "weights_gib_per_gpu" not in case["measured"]:
            continue
        reason = WEIGHT_XFAIL.get(case["name"])
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(case, id=case["name"], marks=marks))
    return params


@pytest.mark.parametrize("case", _weight_params())
def test_weights_match_model_loading_line(case: dict[str, Any]) -> None:
    tolerance = WEIGHT_TOLERANCE.get(case["name"], 0.01)
    predicted = plan(request_for(case)).weights_gib_per_gpu
    assert predicted == pytest.approx(case["measured"]["weights_gib_per_gpu"], rel=tolerance)


@pytest.mark.parametrize("case", cases_with("kv_cache_blocks", "kv_cache_gib"))
def test_blocks_from_measured_kv_memory_match_vllm(case: dict[str, Any]) -> None:
    # Exact up to print rounding: vLLM printed the KV memory to 0.01 GiB, so the blocks it implies may
    # differ from the block count vLLM printed by at most 0.005 GiB's worth of blocks.
    result = plan(request_for(case))
    block_bytes = case.get("block_size", 16) * result.kv_bytes_per_token_per_gpu
    capacity = kv_cache_capacity(
        int(measured_kv_gib(case) * GIB), result.kv_bytes_per_token_per_gpu, case.get("block_size", 16), 1
    )
    allowed = math.ceil(0.005 * GIB / block_bytes)
    assert abs(capacity.blocks - case["measured"]["kv_cache_blocks"]) <= allowed


def hand_kv_bytes_per_token(case: dict[str, Any]) -> int:
    """2 (K, V) x layers x KV heads per rank x head_dim x 2 bytes, from config.json by hand (PP = 1 cases)."""
    config = _case_config(case)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = max(1, config["num_key_value_heads"] // case.get("tensor_parallel_size", 1))
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * 2


@pytest.mark.parametrize("case", cases_with("max_concurrency"))
def test_concurrency_from_measured_kv_cache_is_exact(case: dict[str, Any]) -> None:
    # The planner's own answer, given the KV memory that holds exactly the tokens vLLM printed (bytes per
    # token computed by hand, not by the planner): a wrong kv_bytes_per_token changes the tokens.
    tokens = measured_tokens(case)
    memory = tokens * hand_kv_bytes_per_token(case) / GIB
    result = plan(request_for(case, kv_cache_memory_gib=memory))
    assert result.kv_bytes_per_token_per_gpu == hand_kv_bytes_per_token(case)
    assert result.kv_cache_tokens == tokens
    # vLLM prints "Maximum concurrency ... %.2fx": the same formatting must give the same digits.
    assert f"{result.max_concurrency:.2f}" == f"{case['measured']['max_concurrency']:.2f}"


@pytest.mark.parametrize("case", cases_with("gpu_total_gib", "gpu_memory_utilization", "max_concurrency"))
def test_kv_cache_estimate_is_within_documented_bound(case: dict[str, Any]) -> None:
    result = plan(request_for(case))
    measured = measured_tokens(case) * result.kv_bytes_per_token_per_gpu / GIB
    bound = KV_BOUND_EXCEPTIONS.get(case["name"], KV_BOUND)
    assert result.kv_cache_gib_per_gpu == pytest.approx(measured, rel=bound)
    assert result.kv_cache_tokens == pytest.approx(measured_tokens(case), rel=bound)


@pytest.mark.parametrize("case", cases_with("gpu_total_gib", "gpu_memory_utilization", "max_concurrency"))
def test_cases_vllm_started_have_no_errors(case: dict[str, Any]) -> None:
    assert plan(request_for(case)).errors == []


@pytest.mark.parametrize("case", cases_with("error"))
def test_case_vllm_refused_is_refused_in_vllm_words(case: dict[str, Any]) -> None:
    errors = plan(request_for(case)).errors
    assert any("No available memory for the cache blocks" in error for error in errors)
    assert any("gpu_memory_utilization" in error for error in errors)


@pytest.mark.parametrize("case", cases_with("non_torch_gib"))
def test_non_torch_estimate_is_near_measured(case: dict[str, Any]) -> None:
    assert plan(request_for(case)).non_torch_gib == pytest.approx(case["measured"]["non_torch_gib"], abs=0.1)


@pytest.mark.parametrize("case", cases_with("activation_peak_gib"))
def test_activation_estimate_is_near_the_measurement(case: dict[str, Any]) -> None:
    measured = case["measured"]["activation_peak_gib"]
    assert plan(request_for(case)).activation_peak_gib == pytest.approx(measured, abs=0.15)


# --- Synthetic configs: one rule each ------------------------------------------------------------------


def llama(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    return config | overrides


def plan_for(config: dict[str, Any], memory_gib: float = 80.0, gpu: str = "H100", **settings: Any) -> Plan:
    settings.setdefault("max_model_len", 4096)
    return plan(PlanRequest(hf_config=config, gpus=(GpuDevice(name=gpu, memory_gib=memory_gib),), **settings))


def params_for(config: dict[str, Any], **settings: Any) -> Plan:
    """The plan on a GPU whose name places no platform: weights are the tensors' bytes, not CUDA blocks."""
    return plan_for(config, gpu="GPU", **settings)


def test_gqa_bytes_per_token() -> None:
    # 2 x 8 layers x (4 KV heads / TP 2) x 64 head_dim x 2 bytes
    assert plan_for(llama(), tensor_parallel_size=2).kv_bytes_per_token_per_gpu == 2 * 8 * 2 * 64 * 2


def test_mqa_kv_head_is_replicated_on_every_rank() -> None:
    result = plan_for(llama(num_key_value_heads=1), tensor_parallel_size=4)
    assert result.kv_bytes_per_token_per_gpu == 2 * 8 * 1 * 64 * 2
    assert result.errors == []


def test_explicit_head_dim_wins_over_hidden_over_heads() -> None:
    result = plan_for(llama(head_dim=128))
    assert result.kv_bytes_per_token_per_gpu == 2 * 8 * 4 * 128 * 2


def test_explicit_head_dim_sizes_attention_weights() -> None:
    # params_for: tensors as they are (plan_for's CUDA allocator blocks and shared segments would blur it).
    narrow = params_for(llama()).stages[0].decoder_layers_gib
    wide = params_for(llama(head_dim=128)).stages[0].decoder_layers_gib
    # q (16 heads), k and v (4 heads each) and o (16 heads) grow by 64 per head: 1024 x 64 x 40 per layer.
    assert (wide - narrow) * GIB == 8 * 1024 * 64 * 40 * 2


def test_tied_embeddings_hold_one_table() -> None:
    untied = params_for(llama()).weights_gib_per_gpu
    tied = params_for(llama(tie_word_embeddings=True)).weights_gib_per_gpu
    assert (untied - tied) * GIB == 32000 * 1024 * 2
    # On a CUDA GPU the table is a 62.5 MiB block rounded up to its 64 MiB segment.
    cuda = (
        plan_for(llama()).weights_gib_per_gpu - plan_for(llama(tie_word_embeddings=True)).weights_gib_per_gpu
    )
    assert cuda * GIB == 64 * 2**20


def test_tied_embeddings_are_copied_to_the_last_pipeline_stage() -> None:
    stages = plan_for(llama(tie_word_embeddings=True), pipeline_parallel_size=2).stages
    assert stages[0].embedding_gib == stages[1].embedding_gib > 0
    assert stages[1].lm_head_gib == 0


def test_vocabulary_is_padded_to_64_and_split_over_ranks() -> None:
    stage = params_for(llama(vocab_size=32001), tensor_parallel_size=2).stages[0]
    assert stage.embedding_gib * GIB == (32064 // 2) * 1024 * 2


def test_qwen2_has_qkv_bias_and_qwen3_has_qk_norms() -> None:
    base = params_for(llama()).stages[0].decoder_layers_gib * GIB
    qwen2 = params_for(llama(model_type="qwen2")).stages[0].decoder_layers_gib * GIB
    qwen3 = params_for(llama(model_type="qwen3")).stages[0].decoder_layers_gib * GIB
    assert qwen2 - base == 8 * (16 + 2 * 4) * 64 * 2  # one bias per q/k/v output
    assert qwen3 - base == 8 * 2 * 64 * 2  # q_norm and k_norm over head_dim


@pytest.mark.parametrize(
    ("layers", "pp", "expected"),
    [(10, 4, [2, 3, 3, 2]), (28, 3, [9, 10, 9]), (36, 2, [18, 18]), (7, 7, [1] * 7)],
)
def test_pipeline_split_follows_get_pp_indices(layers: int, pp: int, expected: list[int]) -> None:
    assert [end - start for start, end in pp_layer_split(layers, pp)] == expected


def test_pipeline_stages_hold_embedding_first_and_lm_head_last() -> None:
    stages = plan_for(llama(num_hidden_layers=10), pipeline_parallel_size=4).stages
    assert [stage.embedding_gib > 0 for stage in stages] == [True, False, False, False]
    assert [stage.lm_head_gib > 0 for stage in stages] == [False, False, False, True]
    assert [stage.kv_bytes_per_token for stage in stages] == [2 * n * 4 * 64 * 2 for n in (2, 3, 3, 2)]


def test_fp8_kv_cache_halves_bytes_per_token() -> None:
    full = plan_for(llama()).kv_bytes_per_token_per_gpu
    assert plan_for(llama(), kv_cache_dtype="fp8").kv_bytes_per_token_per_gpu * 2 == full


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        (Quantization("bitsandbytes", bits=4, group_size=64), 4096 * 4096 // 2),
        (Quantization("fp8", bits=8, group_size=0), 4096 * 4096 + 4 + 4),
        # packed 4-bit weight + 4-bit zeros and fp16 scales per group of 128 input rows
        (Quantization("awq"), 4096 * 4096 // 2 + 32 * 4096 // 2 + 32 * 4096 * 2),
        # symmetric GPTQ under Marlin: packed weight and scales (no zeros; no g_idx without act-order)
        (Quantization("gptq", zero_points=False), 4096 * 4096 // 2 + 32 * 4096 * 2),
    ],
    ids=["bitsandbytes", "fp8", "awq", "gptq"],
)
def test_quantized_linear_bytes(quant: Quantization, expected: int) -> None:
    assert param_bytes(Param("w", 4096, 4096), 2, quant)[0] == expected


def test_bitsandbytes_keeps_its_quant_state_on_the_gpu() -> None:
    _, state = param_bytes(Param("w", 4096, 4096), 2, Quantization("bitsandbytes", group_size=64))
    blocks = 4096 * 4096 // 64
    assert state == blocks + math.ceil(blocks / 256) * 4  # uint8 absmax + fp32 second-level absmax


@pytest.mark.parametrize("method", ["bitsandbytes", "fp8", "awq", "gptq"])
def test_quantization_shrinks_layers_not_embeddings_or_lm_head(method: str) -> None:
    plain = plan_for(llama()).stages[0]
    quantized = plan_for(llama(), quantization=method).stages[0]
    assert quantized.embedding_gib == plain.embedding_gib
    assert quantized.lm_head_gib == plain.lm_head_gib
    # AWQ on a Hopper (this GPU is named H100): Machete keeps its zero points as fp16, pre-multiplied by
    # the scales, so 4 bits + 2 x 16 bits per group of 128 = 4.25 bits per weight.
    expected_ratio = {"fp8": 0.5, "awq": 4.25 / 16}.get(method, 0.25)
    assert quantized.decoder_layers_gib / plain.decoder_layers_gib == pytest.approx(expected_ratio, rel=0.05)


def test_quantization_group_size_comes_from_config() -> None:
    config = llama(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 32})
    coarse = plan_for(llama(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128}))
    assert plan_for(config).weights_gib_per_gpu > coarse.weights_gib_per_gpu


def test_quantization_conflicting_with_config_is_refused() -> None:
    result = plan_for(llama(quantization_config={"quant_method": "fp8"}), quantization="awq")
    assert any("does not match the quantization method" in error for error in result.errors)


def test_cpu_offload_moves_at_least_the_budget_and_at_most_one_parameter_more() -> None:
    plain = plan_for(llama()).stages[0]
    offloaded = plan_for(llama(), cpu_offload_gb=0.05).stages[0]
    largest_param = 2 * 4096 * 1024 * 2  # gate_up_proj
    assert 0.05 <= offloaded.offloaded_weights_gib < 0.05 + largest_param / GIB
    assert offloaded.weights_gib == pytest.approx(plain.weights_gib - offloaded.offloaded_weights_gib)
    assert offloaded.embedding_gib == plain.embedding_gib


def test_cpu_offload_larger_than_the_layers_leaves_embeddings_on_gpu() -> None:
    stage = plan_for(llama(), cpu_offload_gb=100).stages[0]
    assert stage.decoder_layers_gib == 0
    assert stage.weights_gib == pytest.approx(stage.embedding_gib + stage.lm_head_gib + stage.other_gib)


@pytest.mark.parametrize(
    ("config_dtype", "requested", "expected"),
    [
        ("float32", "auto", "float16"),
        ("bfloat16", "auto", "bfloat16"),
        ("float16", "auto", "float16"),
        ("bfloat16", "float16", "float16"),
        ("bfloat16", "float32", "float32"),
    ],
)
def test_dtype_resolution(config_dtype: str, requested: str, expected: str) -> None:
    assert plan_for(llama(torch_dtype=config_dtype), dtype=requested).dtype == expected


def test_float32_doubles_weight_bytes() -> None:
    assert params_for(llama(), dtype="float32").weights_gib_per_gpu == pytest.approx(
        2 * params_for(llama()).weights_gib_per_gpu, rel=1e-9
    )


@pytest.mark.parametrize(
    "settings",
    [{"dtype": "float8"}, {"quantization": "squeezellm"}, {"kv_cache_dtype": "int4"}],
    ids=["dtype", "quantization", "kv_cache_dtype"],
)
def test_unknown_setting_raises_planner_input_error(settings: dict[str, Any]) -> None:
    with pytest.raises(PlannerInputError):
        plan_for(llama(), **settings)


@pytest.mark.parametrize(
    "config",
    [{"model_type": "llava", "text_config": {}}],
    ids=["multimodal"],
)
def test_unsupported_architecture_raises_planner_input_error(config: dict[str, Any]) -> None:
    with pytest.raises(PlannerInputError):
        plan_for(config)


def test_mixed_gpus_smallest_decides_and_is_named() -> None:
    gpus = (GpuDevice(name="A100-80GB", memory_gib=79.2), GpuDevice(name="L4", memory_gib=22.0))
    mixed = plan(PlanRequest(hf_config=llama(), gpus=gpus, tensor_parallel_size=2, max_model_len=4096))
    alone = plan(
        PlanRequest(hf_config=llama(), gpus=(gpus[1], gpus[1]), tensor_parallel_size=2, max_model_len=4096)
    )
    assert mixed.kv_cache_blocks == alone.kv_cache_blocks
    assert mixed.gpu_name == "L4"
    assert any("smallest, L4" in warning for warning in mixed.warnings)


def test_kv_cache_memory_replaces_the_estimate() -> None:
    result = plan_for(llama(), kv_cache_memory_gib=1.0)
    assert result.kv_cache_gib_per_gpu == 1.0
    assert result.kv_cache_blocks == GIB // (16 * result.kv_bytes_per_token_per_gpu)
    assert "kv_cache_gib_per_gpu" not in result.estimated


def test_estimated_figures_are_named() -> None:
    assert set(plan_for(llama()).estimated) == {
        "activation_peak_gib",
        "non_torch_gib",
        "cuda_graph_gib",
        "kv_cache_gib_per_gpu",
        "kv_cache_blocks",
        "kv_cache_tokens",
        "max_concurrency",
    }


@pytest.mark.parametrize(
    ("changed", "settings"),
    [({"vocab_size": 64000}, {}), ({}, {"max_num_seqs": 2048, "max_num_batched_tokens": 8192})],
    ids=["vocab_size", "max_num_seqs"],
)
def test_activation_estimate_grows_with_the_sampler(
    changed: dict[str, Any], settings: dict[str, Any]
) -> None:
    assert plan_for(llama(**changed), **settings).activation_peak_gib > plan_for(llama()).activation_peak_gib


def test_activation_estimate_does_not_grow_with_a_dense_model() -> None:
    # vLLM 0.24 measured 2.17, 2.2 and 2.23 GiB for Qwen2.5 1.5B, 7B and 32B: the sampler decides.
    big = llama(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80)
    assert plan_for(big, memory_gib=400).activation_peak_gib == plan_for(llama()).activation_peak_gib


def test_activation_estimate_grows_with_moe_batch() -> None:
    moe = llama(num_local_experts=8, num_experts_per_tok=2)
    small = plan_for(moe, max_num_batched_tokens=4096).activation_peak_gib
    assert plan_for(moe, max_num_batched_tokens=16384).activation_peak_gib > small


def test_non_torch_estimate_is_a_few_hundred_mib_and_more_with_nccl() -> None:
    single = plan_for(llama()).non_torch_gib
    assert 0.2 <= single <= 0.4
    assert plan_for(llama(), tensor_parallel_size=2).non_torch_gib > single


def test_no_cuda_graph_memory_with_enforce_eager() -> None:
    assert plan_for(llama(), enforce_eager=True).cuda_graph_gib == 0
    assert plan_for(llama()).cuda_graph_gib > 0


def test_vllm_serve_batching_defaults_depend_on_the_gpu() -> None:
    assert (plan_for(llama()).max_num_batched_tokens, plan_for(llama()).max_num_seqs) == (8192, 1024)
    small = plan_for(llama(), memory_gib=24.0)
    assert (small.max_num_batched_tokens, small.max_num_seqs) == (2048, 256)


# --- Errors, in vLLM's words, each naming the setting to change ---------------------------------------


def test_max_model_len_above_derived_is_refused() -> None:
    errors = plan_for(llama(), max_model_len=8192).errors
    assert any(
        error.startswith(
            "max_model_len: User-specified max_model_len (8192) is greater than the derived "
            "max_model_len (max_position_embeddings=4096"
        )
        for error in errors
    )


@pytest.mark.parametrize(
    ("rope", "derived"),
    [
        ({"rope_type": "linear", "factor": 4.0}, 16384),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, 8192),
        ({"rope_type": "llama3", "factor": 8.0}, 4096),
    ],
    ids=["linear", "yarn", "llama3"],
)
def test_rope_scaling_sets_derived_max_model_len(rope: dict[str, Any], derived: int) -> None:
    assert plan_for(llama(rope_scaling=rope)).derived_max_model_len == derived


def test_max_model_len_defaults_to_derived() -> None:
    result = plan(PlanRequest(hf_config=llama(), gpus=(GpuDevice(name="H100", memory_gib=80),)))
    assert result.max_model_len == result.derived_max_model_len == 4096


def test_heads_not_divisible_by_tensor_parallel_size_are_refused() -> None:
    errors = plan_for(llama(), tensor_parallel_size=3).errors
    assert any(
        "Total number of attention heads (16) must be divisible by tensor parallel size (3)" in e
        for e in errors
    )


def test_kv_heads_that_cannot_be_split_or_replicated_are_refused() -> None:
    errors = plan_for(llama(num_attention_heads=24, num_key_value_heads=6), tensor_parallel_size=4).errors
    assert any(e.startswith("tensor_parallel_size: number of key-value heads (6)") for e in errors)


def test_more_pipeline_stages_than_layers_are_refused() -> None:
    errors = plan_for(llama(num_hidden_layers=2), pipeline_parallel_size=4).errors
    assert any(e.startswith("pipeline_parallel_size:") for e in errors)


def test_weights_that_do_not_fit_are_refused() -> None:
    errors = plan_for(llama(), memory_gib=1.0, gpu_memory_utilization=0.1).errors
    assert any("No available memory for the cache blocks" in e and "weights alone" in e for e in errors)


def test_kv_cache_smaller_than_one_request_is_refused() -> None:
    # 0.01 GiB / (16 tokens x 8192 bytes per token) = 81 blocks = 1296 tokens < 4096
    errors = plan_for(llama(), kv_cache_memory_gib=0.01).errors
    assert any(
        "The model's max seq len (4096) is larger than the maximum number of tokens that can be stored in "
        "KV cache (1296)" in e
        for e in errors
    )


def test_fewer_batched_tokens_than_sequences_is_refused() -> None:
    errors = plan_for(llama(), max_num_batched_tokens=128, max_num_seqs=256).errors
    assert any(e.startswith("max_num_batched_tokens:") for e in errors)


def test_too_few_gpus_for_the_parallelism_is_refused() -> None:
    gpus = tuple(GpuDevice(name="H100", memory_gib=80) for _ in range(2))
    result = plan(PlanRequest(hf_config=llama(), gpus=gpus, tensor_parallel_size=4, max_model_len=4096))
    assert any("4 GPUs needed but the deployment has 2" in e for e in result.errors)


def test_infeasible_plan_still_returns_figures() -> None:
    result = plan_for(llama(), tensor_parallel_size=3, memory_gib=1.0)
    assert result.errors
    assert result.weights_gib_per_gpu > 0


# --- Inputs and output ---------------------------------------------------------------------------------


def test_load_model_config_accepts_a_directory_or_the_file() -> None:
    directory = DATA / "models" / "Qwen3-8B"
    assert load_model_config(directory) == load_model_config(directory / "config.json")


@pytest.mark.parametrize(
    ("content", "what"), [(None, "cannot read"), ("{", "not valid JSON"), ("[]", "JSON list")]
)
def test_load_model_config_explains_bad_files(tmp_path: Path, content: str | None, what: str) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PlannerInputError, match=what):
        load_model_config(path)


def test_json_dict_holds_the_contract_keys() -> None:
    data = json.loads(json.dumps(plan_for(llama()).to_json_dict()))
    for key in (
        "weights_gib_per_gpu",
        "kv_bytes_per_token_per_gpu",
        "kv_cache_gib_per_gpu",
        "kv_cache_blocks",
        "kv_cache_tokens",
        "max_concurrency",
        "derived_max_model_len",
        "errors",
        "warnings",
        "estimated",
    ):
        assert key in data


def test_request_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match="extra"):
        PlanRequest(hf_config=llama(), gpus=(GpuDevice(name="H100", memory_gib=80),), tp=2)  # type: ignore[call-arg]


# --- Architectures beyond dense decoders: hand-computed figures --------------------------------------

MODELS = Path(__file__).resolve().parent / "data" / "planner_models"


def model(name: str) -> dict[str, Any]:
    return load_model_config(MODELS / name)


def test_moe_without_shared_experts_weights_and_kv() -> None:
    # Qwen3-30B-A3B, one layer: qkv (32 + 2 x 4) x 128 x 2048, o 2048 x 4096, q/k norms 2 x 128, router
    # 128 x 2048, experts 128 x (2 x 768 x 2048 + 2048 x 768), two norms 2 x 2048.
    layer = 40 * 128 * 2048 + 2048 * 4096 + 256 + 128 * 2048 + 128 * 3 * 768 * 2048 + 2 * 2048
    tables = 2 * 151936 * 2048  # embedding and lm_head (151936 is a multiple of 64)
    rotary = 40960 * 128
    expected = (48 * layer + tables + 2048 + rotary) * 2
    result = params_for(model("Qwen3-30B-A3B"), max_model_len=8192)
    assert result.weights_gib_per_gpu * GIB == expected
    assert result.kv_bytes_per_token_per_gpu == 2 * 48 * 4 * 128 * 2


def test_moe_expert_parallel_spreads_whole_experts() -> None:
    config = model("Qwen3-30B-A3B")
    tp = plan_for(config, memory_gib=200, tensor_parallel_size=2, max_model_len=8192)
    ep = plan_for(
        config, memory_gib=200, tensor_parallel_size=2, max_model_len=8192, enable_expert_parallel=True
    )
    # Either way each rank holds half of every expert's bytes (64 whole experts, or a half of 128).
    assert ep.weights_gib_per_gpu == pytest.approx(tp.weights_gib_per_gpu, rel=1e-9)
    assert ep.weights_gib_per_gpu < plan_for(config, max_model_len=8192).weights_gib_per_gpu * 0.55


def test_moe_shared_experts_and_their_gate() -> None:
    config = model("Qwen1.5-MoE-A2.7B")
    without = dict(config, shared_expert_intermediate_size=0)
    # shared expert (gate_up 2 x 5632 x 2048 + down 2048 x 5632) + its 1 x 2048 gate, x 24 layers, bf16.
    extra = 24 * (3 * 5632 * 2048 + 2048) * 2
    difference = plan_for(config).weights_gib_per_gpu - plan_for(without).weights_gib_per_gpu
    assert difference * GIB == pytest.approx(extra)


def test_moe_first_dense_layers_use_the_dense_mlp() -> None:
    config = model("DeepSeek-V2-Lite")
    all_moe = dict(config, first_k_dense_replace=0)
    # Layer 0: dense MLP (3 x 10944 x 2048) instead of router (64 x 2048) + 64 experts (3 x 1408 x 2048)
    # + shared experts (3 x 2816 x 2048).
    dense = 3 * 10944 * 2048
    moe = 64 * 2048 + 64 * 3 * 1408 * 2048 + 3 * 2816 * 2048
    difference = params_for(all_moe).weights_gib_per_gpu - params_for(config).weights_gib_per_gpu
    assert difference * GIB == pytest.approx((moe - dense) * 2)


def test_mla_kv_cache_is_one_latent_per_layer_on_every_rank() -> None:
    config = model("DeepSeek-V2-Lite")
    per_token = 27 * (512 + 64) * 2  # (kv_lora_rank + qk_rope_head_dim) x bf16, heads do not matter
    assert plan_for(config, max_model_len=8192).kv_bytes_per_token_per_gpu == per_token
    tp2 = plan_for(config, max_model_len=8192, tensor_parallel_size=2)
    assert tp2.kv_bytes_per_token_per_gpu == per_token  # not split by tensor parallelism


def test_sliding_window_layers_form_their_own_groups() -> None:
    # Gemma 3 1B: 26 layers, every 6th full (4 full, 22 sliding of 512): groups of 4 layers, 1 full and 6
    # sliding groups; a request of 32768 tokens takes 2048 full blocks and 6 x (cdiv(511 + 8192, 16) + 1).
    config = model("gemma-3-1b-it")
    result = plan_for(config, max_model_len=32768, kv_cache_memory_gib=1.0)
    page = 16 * 2 * 1 * 256 * 2
    blocks = GIB // page // 4
    assert result.kv_cache_groups == 7
    assert result.kv_cache_blocks == blocks
    assert result.kv_cache_tokens == int(blocks / (2048 + 6 * 545) * 32768)


def test_quantized_checkpoints_plan_without_refusal() -> None:
    for name in ("Qwen3-8B-FP8", "Qwen2.5-7B-Instruct-AWQ", "Qwen2.5-7B-Instruct-GPTQ-Int4", "gpt-oss-20b"):
        result = plan_for(model(name), max_model_len=8192)
        assert result.errors == [], name
        assert result.quantization is not None


def test_fp8_block_scales_one_float_per_128_x_128() -> None:
    quant = Quantization("fp8", bits=8, group_size=0, block=(128, 128))
    assert param_bytes(Param("w", 4096, 4096), 2, quant)[0] == 4096 * 4096 + 32 * 32 * 4


def test_online_fp8_halves_the_linear_layers() -> None:
    config = model("Qwen3-30B-A3B")
    online = plan_for(config, quantization="fp8", max_model_len=8192)
    assert online.quantization == "fp8"
    assert online.weights_gib_per_gpu == pytest.approx(29.06, rel=0.01)  # vLLM 0.24: 29.06 GiB


def test_architecture_vllm_does_not_know_is_warned_by_name() -> None:
    warnings = plan_for(llama(architectures=["FancyNewForCausalLM"])).warnings
    assert any("FancyNewForCausalLM" in warning and "0.24.0" in warning for warning in warnings)


# --- Refusals propose what would fit -----------------------------------------------------------------


def test_refusal_proposes_max_model_len_utilization_and_parallelism() -> None:
    config = model("Qwen2.5-32B-Instruct")
    result = plan_for(config, memory_gib=79.18, max_model_len=32768, gpu_memory_utilization=0.82)
    assert result.errors
    proposals = result.proposals
    assert set(proposals) == {
        "max_model_len",
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "pipeline_parallel_size",
    }
    for key, value in proposals.items():
        fixed = plan_for(
            config,
            memory_gib=79.18,
            **({"max_model_len": 32768, "gpu_memory_utilization": 0.82} | {key: value}),
        )
        assert fixed.errors == [], key
    assert "Would fit: --max-model-len" in result.errors[-1]
    assert result.to_json_dict()["proposals"] == proposals


def test_plan_that_fits_proposes_nothing() -> None:
    assert plan_for(llama()).proposals == {}


def test_machete_keeps_awq_zero_points_as_fp16_on_hopper_only() -> None:
    # vLLM 0.24 runs AWQ through Machete on Hopper, which stores -scale x zero in fp16 per group and column.
    plain = Quantization("awq")
    hopper = Quantization("awq", hopper=True)
    param = Param("w", 4096, 4096)
    assert param_bytes(param, 2, hopper)[0] - param_bytes(param, 2, plain)[0] == 32 * 4096 * (2 - 4 / 8)
    # Machete needs out_features divisible by 128: otherwise Marlin keeps the packed zeros.
    odd = Param("w", 4096 + 64, 4096)
    assert param_bytes(odd, 2, hopper) == param_bytes(odd, 2, plain)


def test_triton_mxfp4_keeps_a_second_padded_copy_of_the_expert_scales_on_hopper() -> None:
    experts = Param("experts.w13_weight", 5760, 2880, shards=2, copies=32)
    plain, hopper = Quantization("mxfp4", group_size=32), Quantization("mxfp4", group_size=32, hopper=True)
    extra = param_bytes(experts, 2, hopper)[0] - param_bytes(experts, 2, plain)[0]
    assert extra == 32 * 5888 * 90  # rows padded to a multiple of 256 (HopperMXScaleLayout), 90 scale columns
    bias = Param("experts.w13_bias", 5760, copies=32)
    assert param_bytes(bias, 2, hopper)[0] == 2 * param_bytes(bias, 2, plain)[0]  # float32 biases


MIB = 2**20


@pytest.mark.parametrize(
    ("nbytes", "block"),
    [
        (4, 512),  # every request rounded up to 512 bytes
        (256, 512),
        (2304, 2560),
        (3_538_944, 3_538_944),  # 1-10 MiB: cut from a shared 20 MiB segment
        (15_925_248, 16 * MIB),  # 15.19 MiB: own 16 MiB segment, 0.81 MiB left is not split off
        (16_957_440, 16_957_440),  # 16.17 MiB: 1.83 MiB left is split off
        (31_850_496, 32 * MIB),  # 30.375 MiB >= max_split_size (20 MiB while loading): never split
        (1_244_659_712, 1188 * MIB),  # a 1187 MiB embedding holds 1188 MiB
        (48 * MIB, 48 * MIB),
    ],
)
def test_cuda_block_bytes_follow_the_caching_allocator_under_vllm_load_settings(
    nbytes: int, block: int
) -> None:
    assert cuda_block_bytes(nbytes) == block


def test_nvidia_gpus_are_told_by_name() -> None:
    nvidia = ["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 3090", "Tesla T4", "H100", "a100", "NVIDIA H800"]
    assert all(is_nvidia(name) for name in nvidia)
    others = ["GPU", "GPU under test", "AMD Instinct MI300X", "Intel(R) Data Center GPU Max 1550"]
    assert not any(is_nvidia(name) for name in others)


@pytest.mark.parametrize(
    "quant",
    [
        None,
        Quantization("bitsandbytes", bits=4, group_size=64),
        Quantization("bitsandbytes", bits=8, group_size=0),
        Quantization("fp8", bits=8, group_size=0),
        Quantization("fp8", bits=8, group_size=0, online=True),
        Quantization("fp8", bits=8, group_size=0, block=(128, 128)),
        Quantization("fp8", bits=8, group_size=0, per_channel=True),
        Quantization("int8", bits=8, group_size=0, per_channel=True),
        Quantization("awq"),
        Quantization("awq", hopper=True),
        Quantization("gptq", zero_points=False),
        Quantization("mxfp4", group_size=32, experts_only=True),
        Quantization("mxfp4", group_size=32, experts_only=True, hopper=True),
    ],
)
def test_param_tensors_add_up_to_param_bytes(quant: Quantization | None) -> None:
    for param in (
        Param("qkv_proj.weight", 6144, 4096, shards=3),
        Param("experts.w13_weight", 5760, 2880, shards=2, copies=32),
        Param("experts.w13_bias", 5760, copies=32),
        Param("input_layernorm.weight", 4096),
    ):
        tensor, state = param_bytes(param, 2, quant)
        assert sum(param_tensors(param, 2, quant)) == tensor + state


def test_gpt_oss_rotary_cache_is_float32() -> None:
    config = {
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_hidden_layers": 2,
        "vocab_size": 201088,
        "intermediate_size": 2880,
        "num_local_experts": 32,
    }
    assert parse_arch(config).rotary_dtype_bytes == 4
    assert parse_arch(config | {"model_type": "llama"}).rotary_dtype_bytes == 0


def test_inventory_expert_parallel_variable_changes_weights_per_rank(tmp_path: Path) -> None:
    # vllm_service_enable_expert_parallel reaches the planner from the inventory (validate/plan -i), as the
    # other vllm_service_* variables do. The model: Qwen3-30B-A3B cut to 4 layers, with 127 experts so that
    # the 2 ranks of the example inventory cannot split them evenly: with EP the busiest rank holds 64 whole
    # experts, without it every rank holds half of each of the 127.
    models = Path(__file__).resolve().parent / "data" / "planner_models"
    config = json.loads((models / "Qwen3-30B-A3B" / "config.json").read_text(encoding="utf-8"))
    (tmp_path / "config.json").write_text(
        json.dumps(config | {"num_experts": 127, "num_hidden_layers": 4}), encoding="utf-8"
    )
    inventory = tmp_path / "tp-across-nodes"
    shutil.copytree(REPO / "inventories" / "examples" / "tp-across-nodes", inventory)
    group_vars = inventory / "group_vars" / "gpu_nodes.yml"
    text = group_vars.read_text(encoding="utf-8").replace(
        "gpufleet_model_config: ../../../models/Qwen2.5-1.5B-Instruct/config.json",
        f"gpufleet_model_config: {tmp_path / 'config.json'}",
    )
    group_vars.write_text(text, encoding="utf-8")
    without = plan_request_for_inventory(inventory)
    group_vars.write_text(text + "vllm_service_enable_expert_parallel: true\n", encoding="utf-8")
    with_ep = plan_request_for_inventory(inventory)
    assert (without.enable_expert_parallel, with_ep.enable_expert_parallel) == (False, True)
    layers = 4
    expert_bytes = 3 * 768 * 2048 * 2  # w13 (2 x 768) and w2 (768) rows of 2048, bf16, per expert and layer
    difference = plan(with_ep).stages[0].decoder_layers_gib - plan(without).stages[0].decoder_layers_gib
    # The same two requests on GPUs whose names place no platform: the bytes of the expert tensors.
    neutral = [
        plan(
            request.model_copy(
                update={"gpus": tuple(gpu.model_copy(update={"name": "GPU"}) for gpu in request.gpus)}
            )
        )
        for request in (with_ep, without)
    ]
    tensors = neutral[0].stages[0].decoder_layers_gib - neutral[1].stages[0].decoder_layers_gib
    assert tensors * GIB == pytest.approx(layers * (64 - 127 / 2) * expert_bytes)
    # The example inventory's GPUs are NVIDIA ones, where each fused expert tensor is a block rounded up to
    # 2 MiB: w13 and w2 of 64 whole experts (384 and 192 MiB) against halves of 127 (381 and 190.5 MiB,
    # held as 382 and 192).
    assert all(is_nvidia(gpu.name) for gpu in with_ep.gpus)
    w13, w2 = 2 * 768 * 2048 * 2, 768 * 2048 * 2
    with_blocks = cuda_block_bytes(64 * w13) + cuda_block_bytes(64 * w2)
    without_blocks = cuda_block_bytes(127 * w13 // 2) + cuda_block_bytes(127 * w2 // 2)
    assert difference * GIB == layers * (with_blocks - without_blocks)
