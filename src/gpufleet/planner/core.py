"""The vLLM memory planner: what vLLM will do at start-up, and what it will refuse, before deploying.

From a model's ``config.json`` and the hardware, per GPU:

- computed exactly (:mod:`gpufleet.planner.arch`, :mod:`gpufleet.planner.weights`): weights (embeddings,
  attention with GQA/MQA and explicit ``head_dim``, biases, q/k norms, MLP, norms, rotary cache; TP
  sharding, PP split, quantization, ``cpu_offload_gb``), KV bytes per token
  (:mod:`gpufleet.planner.arch`), the derived maximum model length, and, given the KV-cache memory, blocks,
  tokens and maximum concurrency as vLLM 0.24 computes them (:mod:`gpufleet.planner.kvcache`);
- estimated (:mod:`gpufleet.planner.estimates`, formulas and calibration there): activation peak,
  non-torch memory and CUDA-graph memory, hence the KV-cache memory and everything derived from it,
  unless ``kv_cache_memory_gib`` fixes it. :attr:`Plan.estimated` names every estimated figure.

KV memory per GPU = ``memory_gib x gpu_memory_utilization - weights - activation - non-torch - graphs``;
with several pipeline stages each is planned on its own and the stage with the fewest blocks decides
(vLLM gives every rank the smallest block count); with mixed GPUs the smallest GPU decides.

Checked against start-ups of real vLLM 0.24.0 (tests/unit/test_planner_vllm024.py: calibration and
validation sets, KV-cache tokens within 3 %) and the shared cases (tests/unit/test_planner.py); the tables
are in docs/planner.md.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from gpufleet.planner import config_guard
from gpufleet.planner.arch import (
    GIB,
    Quantization,
    checkpoint_quantization,
    derive_max_model_len,
    is_hopper,
    is_nvidia,
    parse_arch,
    pp_layer_split,
    resolve_dtype,
    resolve_kv_cache_dtype,
    resolve_quantization,
    text_config,
)
from gpufleet.planner.base import PlannerInputError
from gpufleet.planner.checks import check_kv_cache, check_settings, context_warnings
from gpufleet.planner.estimates import (
    activation_peak_bytes,
    cuda_graph_bytes,
    default_batching,
    model_runner,
    non_torch_bytes,
)
from gpufleet.planner.hf_defaults import with_hf_defaults
from gpufleet.planner.kvcache import kv_layout
from gpufleet.planner.model import (
    Plan,
    PlanContext,
    PlanRequest,
    StagePlan,
)
from gpufleet.planner.multimodal import encoder_profile
from gpufleet.planner.weights import StageShape, stage_weights

# The planner's public surface is gpufleet.planner.__all__; this module adds plan() and load_model_config.
__all__ = ["load_model_config", "plan"]

ALWAYS_ESTIMATED = ("activation_peak_gib", "non_torch_gib", "cuda_graph_gib")
KV_DERIVED = ("kv_cache_gib_per_gpu", "kv_cache_blocks", "kv_cache_tokens", "max_concurrency")


def load_model_config(path: Path) -> dict[str, Any]:
    """Read a model's config.json; ``path`` is the model directory or the file itself."""
    file = path / "config.json" if path.is_dir() else path
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise PlannerInputError(
            f"{file}: bytes that are not UTF-8 at offset {error.start}; expected the model's config.json "
            "(JSON text)"
        ) from None
    except OSError as error:
        raise PlannerInputError(
            f"{file}: cannot read ({error.strerror or error}); expected a model directory holding "
            "config.json, or the config.json itself"
        ) from error
    return config_guard.parse(text, file)  # bounded nesting, no duplicate key, one JSON object (plan() checks
    # the values)


def resolve(request: PlanRequest) -> PlanContext:
    """Resolve the request; raises PlannerInputError for a config or setting the planner cannot use."""
    arch = parse_arch(request.hf_config)
    # a multimodal model's language model, with the keys transformers' config class fills in
    config = text_config(with_hf_defaults(request.hf_config))
    dtype = resolve_dtype(request.dtype, config)
    kv_name, kv_bytes = resolve_kv_cache_dtype(request.kv_cache_dtype, dtype)
    gpu = min(request.gpus, key=lambda device: device.memory_gib)
    tokens, seqs = default_batching(gpu.name, gpu.memory_gib)
    return PlanContext(
        request=request,
        arch=arch,
        dtype=dtype,
        kv_cache_dtype=kv_name,
        kv_dtype_bytes=kv_bytes,
        quant=_on_gpu(resolve_quantization(request.quantization, config), gpu.name),
        derived=derive_max_model_len(config),
        gpu=gpu,
        batching=(request.max_num_batched_tokens or tokens, request.max_num_seqs or seqs),
        config_quantization=checkpoint_quantization(config),
    )


def _on_gpu(quant: Quantization | None, gpu_name: str) -> Quantization | None:
    """The quantization as laid out for the deciding GPU's kernels (Hopper re-lays some weights)."""
    if quant is None or not is_hopper(gpu_name):
        return quant
    return dataclasses.replace(quant, hopper=True)


def _gib(value: int) -> float:
    return value / GIB


def plan_stage(context: PlanContext, rank: int, bounds: tuple[int, int]) -> StagePlan:
    """Weights, overheads and KV cache on one GPU of pipeline stage ``rank``."""
    request, arch = context.request, context.arch
    tp, pp = request.tensor_parallel_size, request.pipeline_parallel_size
    layers = bounds[1] - bounds[0]
    runner = model_runner(arch)
    shape = StageShape(
        tp,
        rank,
        pp,
        layers,
        context.dtype_bytes,
        rotary_positions=context.derived.value,
        first_layer=bounds[0],
        expert_parallel=request.enable_expert_parallel,
        cuda_allocator=is_nvidia(context.gpu.name),
        vision_tower=arch.vision is not None and arch.vision.builds_tower(request.limit_mm_per_prompt),
        batched_tokens=context.batching[0],
        mm_limits=request.limit_mm_per_prompt,
    )
    weights = stage_weights(arch, shape, context.quant, request.cpu_offload_gb)
    activation = activation_peak_bytes(
        arch,
        tp,
        context.batching,
        context.dtype_bytes,
        last_stage=rank == pp - 1,
        staging=weights.largest_offloaded_layer_bytes,
        runner=runner,
    )
    if arch.vision is not None and shape.vision_tower:
        # The profile run encodes dummy images or videos first and keeps their outputs while the language
        # model's dummy batch runs: the peak is the larger of the two phases.
        encoder = encoder_profile(
            arch.vision,
            request.limit_mm_per_prompt,
            max_model_len=context.max_model_len,
            batching=context.batching,
            tp=tp,
            dtype_bytes=context.dtype_bytes,
        )
        if encoder is not None:
            activation = max(activation + encoder.outputs_bytes, encoder.forward_peak_bytes)
    non_torch = non_torch_bytes(context.world_size)
    graphs = cuda_graph_bytes(arch, layers, request.enforce_eager, runner)
    if request.kv_cache_memory_gib is not None:
        kv = int(request.kv_cache_memory_gib * GIB)
    else:
        requested = int(context.gpu.memory_gib * request.gpu_memory_utilization * GIB)
        kv = requested - weights.total_bytes - activation - non_torch - graphs
    layout = kv_layout(
        arch, range(*bounds), tp, context.kv_dtype_bytes, request.block_size, dtype_bytes=context.dtype_bytes
    )
    blocks = layout.blocks(kv)
    return StagePlan(
        pipeline_rank=rank,
        first_layer=bounds[0],
        end_layer=bounds[1],
        embedding_gib=_gib(weights.embedding_bytes),
        decoder_layers_gib=_gib(weights.layers_bytes),
        lm_head_gib=_gib(weights.lm_head_bytes),
        other_gib=_gib(weights.other_bytes),
        weights_gib=_gib(weights.total_bytes),
        vision_tower_gib=_gib(weights.vision_bytes),
        offloaded_weights_gib=_gib(weights.offloaded_bytes),
        activation_peak_gib=_gib(activation),
        non_torch_gib=_gib(non_torch),
        cuda_graph_gib=_gib(graphs),
        kv_bytes_per_token=layout.bytes_per_token,
        kv_cache_gib=_gib(max(kv, 0)),
        kv_cache_blocks=blocks,
    )


def plan(request: PlanRequest) -> Plan:
    """Plan a deployment. Infeasible settings go into ``Plan.errors``; only unusable input raises
    :class:`PlannerInputError` (unreadable config, unknown dtype or quantization, unsupported model).

    When the KV cache does not fit, ``Plan.proposals`` names settings that would: the largest
    ``max_model_len``, the smallest ``gpu_memory_utilization``, ``tensor_parallel_size`` or
    ``pipeline_parallel_size`` (on GPUs like the deciding one); the KV error repeats them."""
    config_guard.check(request.hf_config)  # a config given as a mapping gets the file's checks
    result = _plan(request)
    if not result.kv_cache_blocks or result.kv_cache_tokens < result.max_model_len:
        proposals = propose(request, result)
        if proposals:
            listed = ", ".join(f"--{key.replace('_', '-')} {value}" for key, value in proposals.items())
            errors = [
                f"{error.rstrip('.')}. Would fit: {listed}" if error.startswith(KV_ERROR_PREFIXES) else error
                for error in result.errors
            ]
            result = result.model_copy(update={"proposals": proposals, "errors": errors})
    return result


KV_ERROR_PREFIXES = ("gpu_memory_utilization: No available memory", "max_model_len: The model's max seq len")
PROPOSAL_LIMIT = 16  # GPUs per parallel dimension tried


def _fits(result: Plan) -> bool:
    return not result.errors and result.kv_cache_tokens >= result.max_model_len


def propose(request: PlanRequest, result: Plan) -> dict[str, float | int]:
    """Settings that would fit, each changed alone from ``request``."""
    if request.kv_cache_memory_gib is not None:
        return {}
    proposals: dict[str, float | int] = {}
    context = resolve(request)
    deciding = result.stages[result.deciding_stage]
    layout = kv_layout(
        context.arch,
        range(deciding.first_layer, deciding.end_layer),
        request.tensor_parallel_size,
        context.kv_dtype_bytes,
        request.block_size,
        dtype_bytes=context.dtype_bytes,
    )
    blocks, batched = result.kv_cache_blocks, result.max_num_batched_tokens
    if blocks and layout.blocks_per_request(1, batched) <= blocks:
        low, high = 1, result.max_model_len
        while low < high:  # the largest length whose request fits in the blocks there are
            middle = (low + high + 1) // 2
            low, high = (
                (middle, high) if layout.blocks_per_request(middle, batched) <= blocks else (low, middle - 1)
            )
        proposals["max_model_len"] = low
    needed = layout.blocks_per_request(result.max_model_len, batched) * layout.block_bytes / GIB
    overheads = deciding.weights_gib + deciding.activation_peak_gib + deciding.non_torch_gib
    utilization = (
        math.ceil((overheads + deciding.cuda_graph_gib + needed) / result.gpu_memory_gib * 100) / 100
    )
    if utilization <= 1:
        proposals["gpu_memory_utilization"] = utilization
    gpus = (min(request.gpus, key=lambda device: device.memory_gib),)
    for key, current in (
        ("tensor_parallel_size", request.tensor_parallel_size),
        ("pipeline_parallel_size", request.pipeline_parallel_size),
    ):
        for size in range(current + 1, PROPOSAL_LIMIT + 1):
            candidate = request.model_copy(update={key: size, "gpus": gpus})
            if _fits(_plan(candidate)):
                proposals[key] = size
                break
    return proposals


def _plan(request: PlanRequest) -> Plan:
    context = resolve(request)
    errors = check_settings(context)
    bounds = pp_layer_split(context.arch.num_layers, request.pipeline_parallel_size)
    stages = [plan_stage(context, rank, bound) for rank, bound in enumerate(bounds)]
    # A stage without layers holds no KV cache (and is an error of its own).
    candidates = [stage for stage in stages if stage.end_layer > stage.first_layer] or stages
    deciding = min(candidates, key=lambda stage: (stage.kv_cache_blocks, -stage.weights_gib))
    layout = kv_layout(
        context.arch,
        range(deciding.first_layer, deciding.end_layer),
        request.tensor_parallel_size,
        context.kv_dtype_bytes,
        request.block_size,
        dtype_bytes=context.dtype_bytes,
    )
    tokens, concurrency = layout.capacity(
        deciding.kv_cache_blocks, context.max_model_len, context.batching[0]
    )
    kv_errors, kv_warnings = check_kv_cache(context, deciding, tokens)
    estimated = list(ALWAYS_ESTIMATED)
    if request.kv_cache_memory_gib is None:
        estimated += KV_DERIVED
    return Plan(
        model_type=context.arch.model_type,
        dtype=context.dtype,
        kv_cache_dtype=context.kv_cache_dtype,
        quantization=context.quant.method if context.quant else None,
        gpu_name=context.gpu.name,
        gpu_memory_gib=context.gpu.memory_gib,
        tensor_parallel_size=request.tensor_parallel_size,
        pipeline_parallel_size=request.pipeline_parallel_size,
        gpu_memory_utilization=request.gpu_memory_utilization,
        requested_gib_per_gpu=context.gpu.memory_gib * request.gpu_memory_utilization,
        max_model_len=context.max_model_len,
        derived_max_model_len=context.derived.value,
        max_num_batched_tokens=context.batching[0],
        max_num_seqs=context.batching[1],
        block_size=layout.block_size,
        weights_gib_per_gpu=deciding.weights_gib,
        vision_tower_gib_per_gpu=deciding.vision_tower_gib,
        offloaded_weights_gib_per_gpu=deciding.offloaded_weights_gib,
        activation_peak_gib=deciding.activation_peak_gib,
        non_torch_gib=deciding.non_torch_gib,
        cuda_graph_gib=deciding.cuda_graph_gib,
        kv_bytes_per_token_per_gpu=deciding.kv_bytes_per_token,
        kv_cache_gib_per_gpu=deciding.kv_cache_gib,
        kv_cache_blocks=deciding.kv_cache_blocks,
        kv_cache_tokens=tokens,
        max_concurrency=concurrency,
        model_runner=model_runner(context.arch),
        kv_cache_groups=len(layout.windows) + layout.mamba_groups,
        estimated=estimated,
        deciding_stage=deciding.pipeline_rank,
        stages=stages,
        errors=errors + kv_errors,
        warnings=context_warnings(context) + kv_warnings,
        proposals={},
    )
