"""What a model's ``config.json`` fixes exactly: dtypes, quantization, shapes, parameter bytes, KV bytes.

Everything here mirrors how vLLM builds the model, so the figures are computed, not estimated:

- dtype ``auto`` takes ``torch_dtype`` from config.json (float32 checkpoints are served as float16, as
  vLLM does); an explicit dtype wins.
- Each decoder layer is ``qkv_proj`` (+ bias for Qwen2 or ``attention_bias``), ``o_proj``, ``q_norm`` and
  ``k_norm`` for Qwen3/Gemma3, ``gate_up_proj``, ``down_proj`` and two RMSNorms, in vLLM's registration
  order (which decides where ``cpu_offload_gb`` stops).
- Tensor parallelism shards heads, the MLP and the vocabulary (padded to a multiple of 64, then split);
  KV heads are replicated when there are fewer of them than ranks.
- Pipeline parallelism splits layers as vLLM's ``get_pp_indices`` does: the remainder goes to the stages
  before the last, starting from the second-last; the first stage holds the embedding, the last the final
  norm and ``lm_head`` (a second copy of the embedding when the embeddings are tied and PP > 1).
- Quantization shrinks linear layers only; embeddings, ``lm_head`` and norms stay in the model dtype.
- The rotary cos/sin cache (``max_position x rotary_dim`` in the model dtype) is counted: vLLM's
  "Model loading took" includes it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

GIB = 2**30
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE

# vLLM's --dtype choices (plus the short names people type) -> canonical name.
DTYPE_ALIASES = {
    "half": "float16",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float": "float32",
    "float32": "float32",
    "fp32": "float32",
}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
KV_CACHE_DTYPE_BYTES = {"bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}
QUANTIZATION_ALIASES = {
    "bitsandbytes": "bitsandbytes",
    "fp8": "fp8",
    "awq": "awq",
    "awq_marlin": "awq",
    "gptq": "gptq",
    "gptq_marlin": "gptq",
}
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
# vLLM's _get_and_verify_max_len looks at all of these and takes the smallest.
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


class PlannerInputError(ValueError):
    """Input the planner cannot work with: an unreadable config.json, an unknown dtype or quantization."""


@dataclass(frozen=True)
class ModelArch:
    """The shape of a dense decoder-only transformer, as read from config.json."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rotary_dim: int


@dataclass(frozen=True)
class Quantization:
    """How vLLM stores a linear layer's weight under one quantization method."""

    method: str  # bitsandbytes | fp8 | awq | gptq
    bits: int = 4
    group_size: int = 128
    # bitsandbytes: absmax stored as uint8 (vLLM quantizes with compress_statistics=True).
    double_quant: bool = True
    block: tuple[int, int] | None = None  # fp8 checkpoints with block-wise scales


@dataclass(frozen=True)
class Param:
    """One parameter of a decoder layer on one rank; ``in_features == 0`` marks a vector (bias, norm)."""

    name: str
    out_features: int
    in_features: int = 0
    shards: int = 1  # logical shards fused into one parameter (q/k/v, gate/up): one fp8 scale each

    @property
    def is_linear(self) -> bool:
        return self.in_features > 0


@dataclass(frozen=True)
class DerivedMaxLen:
    value: int
    source: str  # how vLLM words it: "max_position_embeddings=40960"


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlannerInputError(
            f"config.json: {key}: found {value!r}; expected a positive integer. "
            "Fix: point the planner at the model's own config.json (a dense decoder-only transformer)"
        )
    return value


def parse_arch(config: Mapping[str, Any]) -> ModelArch:
    """Read the shape of the model; raises PlannerInputError for configs the planner cannot model."""
    _refuse_unsupported(config)
    model_type = str(config.get("model_type", "unknown"))
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    kv_heads = config.get("num_key_value_heads")
    if kv_heads is None:
        kv_heads = 1 if config.get("multi_query") else heads
    head_dim = config.get("head_dim") or hidden // heads
    attention_bias = bool(config.get("attention_bias", False))
    return ModelArch(
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=_int(config, "intermediate_size"),
        num_layers=_int(config, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=_int({"num_key_value_heads": kv_heads}, "num_key_value_heads"),
        head_dim=_int({"head_dim": head_dim}, "head_dim"),
        vocab_size=_int(config, "vocab_size"),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        # vLLM's Qwen2 attention always has q/k/v biases; Llama-style models follow attention_bias.
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type in {"qwen3", "gemma3_text", "gemma3"},
        rotary_dim=int(head_dim * float(config.get("partial_rotary_factor", 1.0))),
    )


def _refuse_unsupported(config: Mapping[str, Any]) -> None:
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        raise PlannerInputError(
            "config.json: text_config: found a multimodal model; expected a text-only decoder. "
            "Fix: the planner does not model vision towers yet; size this deployment by hand"
        )
    for key in MOE_KEYS:
        if config.get(key):
            raise PlannerInputError(
                f"config.json: {key}: found {config[key]!r}; expected a dense model. "
                "Fix: the planner does not model mixture-of-experts layers yet; size this deployment by hand"
            )
    if config.get("kv_lora_rank"):
        raise PlannerInputError(
            "config.json: kv_lora_rank: found multi-head latent attention; expected standard attention. "
            "Fix: the planner does not model MLA (DeepSeek-style) KV caches yet"
        )


def config_dtype(config: Mapping[str, Any]) -> str | None:
    raw = config.get("torch_dtype") or config.get("dtype")
    return DTYPE_ALIASES.get(str(raw).lower()) if raw else None


def resolve_dtype(requested: str, config: Mapping[str, Any]) -> str:
    """The dtype vLLM serves in: ``auto`` follows config.json (float32 -> float16), explicit wins."""
    name = requested.lower()
    if name == "auto":
        found = config_dtype(config) or "float32"  # vLLM treats a missing torch_dtype as float32
        return "float16" if found == "float32" else found
    if name not in DTYPE_ALIASES:
        raise PlannerInputError(
            f"dtype: found {requested!r}; expected one of auto, float16, bfloat16, float32. "
            "Fix: pass a dtype vLLM accepts (--dtype)"
        )
    return DTYPE_ALIASES[name]


def resolve_kv_cache_dtype(requested: str, dtype: str) -> tuple[str, int]:
    """The KV-cache dtype and its bytes per element (``auto`` = the model dtype)."""
    name = requested.lower()
    if name == "auto":
        return dtype, DTYPE_BYTES[dtype]
    if name not in KV_CACHE_DTYPE_BYTES:
        choices = ", ".join(["auto", *KV_CACHE_DTYPE_BYTES])
        raise PlannerInputError(
            f"kv_cache_dtype: found {requested!r}; expected one of {choices}. "
            "Fix: pass a KV-cache dtype vLLM accepts (--kv-cache-dtype)"
        )
    return name, KV_CACHE_DTYPE_BYTES[name]


def checkpoint_quantization(config: Mapping[str, Any]) -> str | None:
    """The quantization method config.json declares (vLLM picks it up without --quantization)."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or not quant.get("quant_method"):
        return None
    return str(quant["quant_method"]).lower()


def resolve_quantization(requested: str | None, config: Mapping[str, Any]) -> Quantization | None:
    """The quantization scheme in effect; raises PlannerInputError for methods the planner cannot model."""
    name = (requested or checkpoint_quantization(config) or "").lower()
    if not name:
        return None
    if name not in QUANTIZATION_ALIASES:
        choices = ", ".join(QUANTIZATION_ALIASES)
        raise PlannerInputError(
            f"quantization: found {name!r}; expected one of {choices}. "
            "Fix: the planner models these methods only; size other methods by hand"
        )
    method = QUANTIZATION_ALIASES[name]
    quant = config.get("quantization_config")
    settings: Mapping[str, Any] = quant if isinstance(quant, dict) else {}
    if method == "bitsandbytes":
        bits = 8 if settings.get("load_in_8bit") else 4
        double = bool(settings.get("bnb_4bit_use_double_quant", True))
        return Quantization(method, bits=bits, group_size=64, double_quant=double)
    if method == "fp8":
        block = settings.get("weight_block_size")
        block_shape = (int(block[0]), int(block[1])) if isinstance(block, list) and len(block) == 2 else None
        return Quantization(method, bits=8, group_size=0, block=block_shape)
    bits = int(settings.get("bits", settings.get("w_bit", 4)))
    group = int(settings.get("group_size", settings.get("q_group_size", 128)))
    return Quantization(method, bits=bits, group_size=group)


def derive_max_model_len(config: Mapping[str, Any]) -> DerivedMaxLen:
    """vLLM's derived max_model_len: the smallest length key, times the RoPE scaling factor."""
    found = [(key, int(config[key])) for key in MAX_LEN_KEYS if isinstance(config.get(key), int)]
    if not found:
        raise PlannerInputError(
            "config.json: max_position_embeddings: found nothing; expected the model's context length. "
            "Fix: point the planner at the model's own config.json"
        )
    key, value = min(found, key=lambda item: item[1])
    source = f"{key}={value}"
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    if isinstance(rope, dict):
        rope_type = str(rope.get("rope_type", rope.get("type", "default")))
        factor = rope.get("factor")
        if rope_type not in {"default", "su", "longrope", "llama3", "mrope"} and factor:
            if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
                value = int(rope["original_max_position_embeddings"])
                source = f"original_max_position_embeddings={value}"
            value = int(value * float(factor))
            source += f" x rope_scaling factor {float(factor):g} ({rope_type}) = {value}"
    return DerivedMaxLen(value, source)


def pp_layer_split(num_layers: int, pp_size: int) -> list[tuple[int, int]]:
    """vLLM's get_pp_indices for every stage: [start, end) per pipeline rank."""
    partitions = [num_layers // pp_size] * pp_size
    remainder = num_layers % pp_size
    for index in range(2, remainder + 2):
        # vLLM gives the remainder to the stages before the last, from the second-last backwards.
        partitions[-index] += 1
    bounds, start = [], 0
    for count in partitions:
        bounds.append((start, start + count))
        start += count
    return bounds


def heads_per_rank(arch: ModelArch, tp: int) -> tuple[int, int]:
    """(query heads, KV heads) on one rank; KV heads are replicated when there are fewer than ranks."""
    return math.ceil(arch.num_heads / tp), max(1, math.ceil(arch.num_kv_heads / tp))


def layer_params(arch: ModelArch, tp: int) -> list[Param]:
    """One decoder layer's parameters on one rank, in vLLM's registration order."""
    q_heads, kv_heads = heads_per_rank(arch, tp)
    qkv_out = (q_heads + 2 * kv_heads) * arch.head_dim
    inter = math.ceil(arch.intermediate_size / tp)
    hidden = arch.hidden_size
    params = [Param("qkv_proj.weight", qkv_out, hidden, shards=3)]
    if arch.qkv_bias:
        params.append(Param("qkv_proj.bias", qkv_out))
    params.append(Param("o_proj.weight", hidden, q_heads * arch.head_dim))
    if arch.o_bias:
        params.append(Param("o_proj.bias", hidden))
    if arch.qk_norm:
        params += [Param("q_norm.weight", arch.head_dim), Param("k_norm.weight", arch.head_dim)]
    params.append(Param("gate_up_proj.weight", 2 * inter, hidden, shards=2))
    if arch.mlp_bias:
        params.append(Param("gate_up_proj.bias", 2 * inter))
    params.append(Param("down_proj.weight", hidden, inter))
    if arch.mlp_bias:
        params.append(Param("down_proj.bias", hidden))
    params += [Param("input_layernorm.weight", hidden), Param("post_attention_layernorm.weight", hidden)]
    return params


def param_bytes(param: Param, dtype_bytes: int, quant: Quantization | None) -> tuple[int, int]:
    """(bytes of the parameter tensors, bytes of quantization state kept beside them on the GPU)."""
    if not param.is_linear or quant is None:
        numel = param.out_features * max(param.in_features, 1)
        return numel * dtype_bytes, 0
    numel = param.out_features * param.in_features
    if quant.method == "bitsandbytes":
        if quant.bits == 8:
            return numel, param.out_features * 4  # int8 weight + one fp32 scale per row
        blocks = math.ceil(numel / quant.group_size)
        absmax = blocks + math.ceil(blocks / 256) * 4 if quant.double_quant else blocks * 4
        return math.ceil(numel / 2), absmax  # two 4-bit values per byte; quant state is not a parameter
    if quant.method == "fp8":
        if quant.block is None:
            return numel + 4 * param.shards + 4, 0  # per-tensor weight scales + input scale (fp32)
        rows, cols = quant.block
        return numel + math.ceil(param.out_features / rows) * math.ceil(param.in_features / cols) * 4, 0
    groups = math.ceil(param.in_features / quant.group_size) if quant.group_size > 0 else 1
    packed = math.ceil(numel * quant.bits / 8)
    zeros = math.ceil(groups * param.out_features * quant.bits / 8)
    scales = groups * param.out_features * 2  # fp16 scales
    g_idx = param.in_features * 4 if quant.method == "gptq" else 0
    return packed + zeros + scales + g_idx, 0


def vocab_per_rank(arch: ModelArch, tp: int) -> int:
    """Rows of the embedding (and lm_head) on one rank: vocab padded to 64, split over TP."""
    padded = math.ceil(arch.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    return math.ceil(padded / tp)


def kv_bytes_per_token(arch: ModelArch, layers: int, tp: int, kv_dtype_bytes: int) -> int:
    """2 (K and V) x layers on this GPU x KV heads per rank x head_dim x bytes per element."""
    _, kv_heads = heads_per_rank(arch, tp)
    return 2 * layers * kv_heads * arch.head_dim * kv_dtype_bytes


def iter_layer_bytes(
    arch: ModelArch, tp: int, layers: int, dtype_bytes: int, quant: Quantization | None
) -> Iterator[tuple[int, int, int]]:
    """(layer index on this GPU, parameter bytes, quant-state bytes) per parameter, in load order."""
    params = [param_bytes(param, dtype_bytes, quant) for param in layer_params(arch, tp)]
    for layer in range(layers):
        for tensor, state in params:
            yield layer, tensor, state
