"""What vLLM refuses (errors, in vLLM's words where vLLM has words) and what deserves a warning.

Every error names the setting to change and ends with a ``Fix:``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.planner.arch import GIB, QUANTIZATION_ALIASES, ModelArch, config_dtype, is_hopper
from gpufleet.planner.hybrid import MambaShape
from gpufleet.planner.multimodal import GENERIC
from gpufleet.planner.towers import tower_tensors

if TYPE_CHECKING:
    from gpufleet.planner.model import PlanContext, StagePlan

from gpufleet.planner.vllm_archs import VLLM_ARCHITECTURES, VLLM_VERSION

# Families whose layers the planner builds parameter by parameter as vLLM does (others: Llama-style).
KNOWN_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen2_moe",
        "qwen3_moe",
        "mixtral",
        "deepseek_v2",
        "deepseek_v3",
        "gemma2",
        "gemma3_text",
        "gpt_oss",
        "nemotron_h",
        "granitemoehybrid",
        "falcon_h1",
        "jamba",
        "qwen3_next",
        "zamba2",
        "qwen2_5_vl",
        "qwen3_vl_text",
        "qwen3_vl_moe_text",
    }
)
# The encoder's profile-run peak of a tower planned as a generic ViT is not modelled: the margin named.
ENCODER_MARGIN_GIB = 1.0
# GPUs before Ampere: no bfloat16 in vLLM (compute capability < 8.0).
PRE_AMPERE = ("v100", "t4", "p100", "p40", "p4", "titan v", "rtx 20", "quadro rtx", "gtx")


def valid_tensor_parallel_sizes(arch: ModelArch) -> list[int]:
    """Tensor-parallel sizes vLLM accepts for this model's heads, KV heads and MLP."""
    return [
        tp
        for tp in range(1, arch.num_heads + 1)
        if arch.num_heads % tp == 0
        and (arch.num_kv_heads % tp == 0 or tp % arch.num_kv_heads == 0)
        and arch.intermediate_size % tp == 0
    ]


def check_settings(context: PlanContext) -> list[str]:
    """Settings vLLM refuses before it allocates anything."""
    return _check_max_model_len(context) + _check_parallelism(context) + _check_other(context)


def _check_max_model_len(context: PlanContext) -> list[str]:
    requested = context.request.max_model_len
    derived = context.derived
    if requested is None or requested <= derived.value:
        return []
    return [
        f"max_model_len: User-specified max_model_len ({requested}) is greater than the derived "
        f"max_model_len ({derived.source} or model_max_length=None in model's config.json). This may lead "
        f"to incorrect model outputs or CUDA errors. Fix: set max_model_len to at most {derived.value}"
    ]


def _check_parallelism(context: PlanContext) -> list[str]:
    arch, request = context.arch, context.request
    tp, pp = request.tensor_parallel_size, request.pipeline_parallel_size
    choices = ", ".join(str(size) for size in valid_tensor_parallel_sizes(arch))
    fix = (
        f"Fix: set tensor_parallel_size to one of {choices} (and spread the rest with pipeline_parallel_size)"
    )
    errors = []
    if arch.num_heads % tp:
        errors.append(
            f"tensor_parallel_size: Total number of attention heads ({arch.num_heads}) must be divisible by "
            f"tensor parallel size ({tp}). {fix}"
        )
    if arch.num_kv_heads % tp and tp % arch.num_kv_heads:
        errors.append(
            f"tensor_parallel_size: number of key-value heads ({arch.num_kv_heads}) and tensor parallel size "
            f"({tp}) must divide one another (vLLM's QKVParallelLinear shards or replicates whole KV heads). "
            f"{fix}"
        )
    if arch.intermediate_size % tp:
        errors.append(
            f"tensor_parallel_size: intermediate_size ({arch.intermediate_size}) is not divisible by tensor "
            f"parallel size ({tp}). {fix}"
        )
    if isinstance(arch.mamba, MambaShape):
        errors += _check_mamba_parallelism(arch.mamba.num_heads, arch.mamba.n_groups, tp)
    if pp > arch.num_layers:
        errors.append(
            f"pipeline_parallel_size: pipeline parallel size ({pp}) is larger than the number of hidden "
            f"layers ({arch.num_layers}); every stage needs at least one layer. "
            f"Fix: set pipeline_parallel_size to at most {arch.num_layers}"
        )
    if pp > 1 and arch.vision is not None and arch.vision.family == "phi4mm":
        errors.append(
            f"pipeline_parallel_size: {arch.vision.architecture} does not run with pipeline parallel size "
            f'{pp} (vLLM 0.24\'s phi4mm.py: "pipeline parallel is not supported"). '
            "Fix: set pipeline_parallel_size to 1 and use tensor_parallel_size"
        )
    gpus = len(request.gpus)
    if 1 < gpus < tp * pp:
        errors.append(
            f"tensor_parallel_size x pipeline_parallel_size: {tp} x {pp} = {tp * pp} GPUs needed but the "
            f"deployment has {gpus}. Fix: lower tensor_parallel_size or pipeline_parallel_size, or add GPUs"
        )
    return errors


def _check_mamba_parallelism(heads: int, groups: int, tp: int) -> list[str]:
    """MambaMixer2's assertions (vllm/model_executor/layers/mamba/mamba_mixer2.py)."""
    choices = ", ".join(
        str(size) for size in range(1, heads + 1) if heads % size == 0 and (groups % size == 0 or groups == 1)
    )
    fix = f"Fix: set tensor_parallel_size to one of {choices}"
    errors = []
    if heads % tp:
        errors.append(
            f"tensor_parallel_size: Tensor parallel world size must divide num heads (Mamba heads {heads}, "
            f"tensor parallel size {tp}). {fix}"
        )
    if groups % tp and groups != 1:
        errors.append(
            "tensor_parallel_size: If tensor parallel world size does not divide num_groups, then num_groups "
            f"must equal 1 (Mamba groups {groups}, tensor parallel size {tp}). {fix}"
        )
    return errors


def _check_other(context: PlanContext) -> list[str]:
    errors = []
    tokens, seqs = context.batching
    if tokens < seqs:
        errors.append(
            f"max_num_batched_tokens: max_num_batched_tokens ({tokens}) must be greater than or equal to "
            f"max_num_seqs ({seqs}). Fix: raise max_num_batched_tokens or lower max_num_seqs"
        )
    errors += _check_fp8_kv_cache_on_fa3(context)
    requested = context.request.quantization
    declared = context.config_quantization
    if (
        requested
        and declared
        and QUANTIZATION_ALIASES.get(requested.lower()) != QUANTIZATION_ALIASES.get(declared)
    ):
        errors.append(
            f"quantization: Quantization method specified in the model config ({declared}) does not match "
            f"the quantization method specified in the `quantization` argument ({requested}). "
            f"Fix: drop quantization (vLLM reads {declared} from config.json) or set it to {declared}"
        )
    return errors


def _check_fp8_kv_cache_on_fa3(context: PlanContext) -> list[str]:
    """float16 + an fp8 KV cache on Hopper: vLLM 0.24 picks FlashAttention 3, which quantizes the queries
    to fp8 and writes bfloat16 only; the engine dies at the profile run's first forward pass
    (tests/unit/data/vllm_logs/v0.24_h100/qwen2.5-7b-gptq-kv-fp8.log: a float16 GPTQ checkpoint)."""
    if (
        context.dtype != "float16"
        or not context.kv_cache_dtype.startswith("fp8")
        or context.arch.mla is not None  # MLA has its own backends
        or not is_hopper(context.gpu.name)
    ):
        return []
    return [
        f"kv_cache_dtype: {context.kv_cache_dtype} with dtype float16 fails on {context.gpu.name}: vLLM "
        f"{VLLM_VERSION} serves an fp8 KV cache on Hopper with FlashAttention 3, which quantizes the "
        'queries to fp8 and then writes only bfloat16 ("For FP16/BF16 input, output must have the same '
        'dtype as inputs. For FP8 input, output must have dtype BF16" at the first forward pass of the '
        "memory profiling). float16 is what dtype auto gives for float16 checkpoints (most AWQ/GPTQ ones). "
        "Fix: set dtype to bfloat16 (vLLM's AWQ/GPTQ kernels take bfloat16 too), or kv_cache_dtype to auto"
    ]


def check_kv_cache(context: PlanContext, stage: StagePlan, tokens: int) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the KV cache on the deciding GPU."""
    if context.request.kv_cache_memory_gib is not None:
        return _check_fixed_kv_cache(context, stage, tokens)
    if stage.kv_cache_blocks == 0:
        return [_no_memory_error(context, stage)], []
    return _check_capacity(context, stage, tokens, estimated=True), []


def _no_memory_error(context: PlanContext, stage: StagePlan) -> str:
    request = context.request
    requested = context.gpu.memory_gib * request.gpu_memory_utilization
    overheads = stage.activation_peak_gib + stage.non_torch_gib + stage.cuda_graph_gib
    if stage.weights_gib >= requested:
        why = f"the weights alone take {stage.weights_gib:.2f} GiB"
    else:
        why = (
            f"weights take {stage.weights_gib:.2f} GiB and activations, non-torch memory and CUDA graphs "
            f"about {overheads:.2f} GiB (estimated)"
        )
    return (
        "gpu_memory_utilization: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine. "
        f"Per GPU ({context.gpu.name}, pipeline stage {stage.pipeline_rank}): requested "
        f"{requested:.2f} GiB ({context.gpu.memory_gib:.2f} GiB x {request.gpu_memory_utilization}) "
        f"but {why}. "
        "Fix: raise gpu_memory_utilization, spread the model over more GPUs (tensor_parallel_size, "
        "pipeline_parallel_size), or shrink it (quantization, cpu_offload_gb)"
    )


def _check_capacity(context: PlanContext, stage: StagePlan, tokens: int, estimated: bool) -> list[str]:
    max_len = context.max_model_len
    if tokens >= max_len:
        return []
    note = " (the KV-cache size is estimated)" if estimated else ""
    return [
        f"max_model_len: The model's max seq len ({max_len}) is larger than the maximum number of tokens "
        f"that can be stored in KV cache ({tokens}){note}. Try increasing `gpu_memory_utilization` or "
        "decreasing `max_model_len` when initializing the engine. "
        f"Fix: set max_model_len to at most {tokens}, or give "
        "the KV cache more memory (gpu_memory_utilization, kv_cache_memory_gib, more GPUs)"
    ]


def _check_fixed_kv_cache(context: PlanContext, stage: StagePlan, tokens: int) -> tuple[list[str], list[str]]:
    total = context.gpu.memory_gib
    kv = stage.kv_cache_gib
    overheads = stage.activation_peak_gib + stage.non_torch_gib + stage.cuda_graph_gib
    if stage.kv_cache_blocks == 0:
        errors = [
            f"kv_cache_memory_gib: {kv:.4f} GiB holds not one block of {context.request.block_size} tokens "
            f"({stage.kv_bytes_per_token} bytes per token). Fix: raise kv_cache_memory_gib"
        ]
    else:
        errors = _check_capacity(context, stage, tokens, estimated=False)
    if stage.weights_gib + kv > total:
        errors.append(
            f"kv_cache_memory_gib: weights {stage.weights_gib:.2f} GiB + KV cache {kv:.2f} GiB exceed the "
            f"{total:.2f} GiB of {context.gpu.name} (CUDA out of memory). Fix: lower kv_cache_memory_gib"
        )
        return errors, []
    if stage.weights_gib + kv + overheads > total:
        return errors, [
            f"kv_cache_memory_gib: weights {stage.weights_gib:.2f} GiB + KV cache {kv:.2f} GiB + about "
            f"{overheads:.2f} GiB of activations, non-torch memory and CUDA graphs (estimated) exceed the "
            f"{total:.2f} GiB of {context.gpu.name}; vLLM may run out of memory"
        ]
    return errors, []


def context_warnings(context: PlanContext) -> list[str]:
    """Warnings that depend only on the request and the model."""
    return _hardware_warnings(context) + _model_warnings(context) + _setting_warnings(context)


def _hardware_warnings(context: PlanContext) -> list[str]:
    request, gpu = context.request, context.gpu
    warnings = []
    sizes = {device.memory_gib for device in request.gpus}
    if len(sizes) > 1:
        listed = ", ".join(sorted({f"{d.name} ({d.memory_gib:g} GiB)" for d in request.gpus}))
        warnings.append(
            f"GPUs differ ({listed}): the smallest, {gpu.name} ({gpu.memory_gib:g} GiB), decides; vLLM gives "
            "every rank the block count of the rank with the fewest, so memory on larger GPUs stays unused"
        )
    if len(request.gpus) > context.world_size > 0 and len(request.gpus) > 1:
        warnings.append(
            f"the deployment has {len(request.gpus)} GPUs but tensor_parallel_size x pipeline_parallel_size "
            f"uses {context.world_size}; the others stay idle"
        )
    if context.dtype == "bfloat16" and any(name in gpu.name.lower() for name in PRE_AMPERE):
        warnings.append(
            f"dtype: bfloat16 needs compute capability 8.0 or newer; {gpu.name} looks older and vLLM would "
            "refuse it. Fix: set dtype to float16"
        )
    return warnings


def _model_warnings(context: PlanContext) -> list[str]:
    arch, request = context.arch, context.request
    warnings = []
    if arch.vision is not None and arch.vision.family == GENERIC:
        tower = sum(tower_tensors(arch.vision, request.tensor_parallel_size, context.dtype_bytes)) / GIB
        margin = tower / 2 + ENCODER_MARGIN_GIB
        warnings.append(
            f"architectures: {arch.vision.architecture or 'the model'}: its vision tower is not read from "
            f"vLLM's code; it is planned as a generic ViT from vision_config ({tower:.2f} GiB) and the "
            f"encoder's profile run as SigLIP's. Margin: keep {margin:.2f} GiB per GPU free beyond this plan "
            f"(half the tower, plus {ENCODER_MARGIN_GIB:.0f} GiB for the encoder's peak), or measure one "
            "start-up"
        )
    if arch.model_type not in KNOWN_MODEL_TYPES:
        warnings.append(
            f"model_type {arch.model_type!r}: planned as a Llama-style dense decoder; check the weights "
            'figure against vLLM\'s "Model loading took" line'
        )
    if request.dtype.lower() == "auto" and config_dtype(request.hf_config) is None:
        warnings.append(
            "config.json has no torch_dtype: vLLM treats the checkpoint as float32 and serves float16"
        )
    if arch.architecture and arch.architecture not in VLLM_ARCHITECTURES:
        warnings.append(
            f"architectures: {arch.architecture} is not a model vLLM {VLLM_VERSION} knows; it would refuse "
            'this model ("Model architectures ... are not supported"). Fix: pick a vLLM that supports it'
        )
    if context.quant and context.quant.method in {"awq", "gptq"} and context.config_quantization is None:
        warnings.append(
            f"quantization {context.quant.method}: config.json declares no quantization_config; vLLM needs a "
            f"pre-quantized checkpoint. Assumed {context.quant.bits}-bit, "
            f"group size {context.quant.group_size}"
        )
    return warnings


def _setting_warnings(context: PlanContext) -> list[str]:
    request = context.request
    warnings = []
    if request.cpu_offload_gb > 0:
        warnings.append(
            f"cpu_offload_gb: up to {request.cpu_offload_gb:g} GiB of weights per GPU live in host memory "
            "and cross PCIe on every forward pass; expect much slower generation"
        )
    if request.kv_cache_memory_gib is not None:
        warnings.append(
            "kv_cache_memory_gib replaces vLLM's memory profiling: gpu_memory_utilization does not size the "
            "KV cache"
        )
    return warnings
