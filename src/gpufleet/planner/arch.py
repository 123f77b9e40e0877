"""What a model's ``config.json`` fixes exactly: dtypes, quantization, shapes, parameter bytes, KV bytes.

Everything here mirrors how vLLM 0.24 builds the model, so the figures are computed, not estimated:

- dtype ``auto`` takes ``torch_dtype`` from config.json (float32 checkpoints are served as float16, as
  vLLM does); an explicit dtype wins.
- Attention: ``qkv_proj`` (+ bias for Qwen2/Qwen2-MoE or ``attention_bias``), ``o_proj``, ``q_norm`` and
  ``k_norm`` for Qwen3/Qwen3-MoE/Gemma 3, attention sinks for gpt-oss; or multi-head latent attention
  (DeepSeek-V2/V3: ``q_proj`` or ``q_a_proj``/``q_b_proj``, the replicated ``kv_a_proj_with_mqa``,
  ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``).
- MLP: dense ``gate_up_proj``/``down_proj``, or a mixture of experts: the router (replicated, never
  quantized), the fused experts ``w13`` (``2 x moe_intermediate_size x hidden``) and ``w2`` per expert,
  shared experts (``shared_expert_intermediate_size`` or ``n_shared_experts x moe_intermediate_size``) and
  Qwen2-MoE's ``shared_expert_gate``. Dense layers inside MoE models follow ``first_k_dense_replace``,
  ``mlp_only_layers`` and ``decoder_sparse_step``.
- Tensor parallelism shards heads, MLPs and the vocabulary (padded to a multiple of 64, then split); KV
  heads are replicated when there are fewer of them than ranks. Experts are sharded on their intermediate
  size, or, with ``--enable-expert-parallel``, spread whole over the ranks.
- Pipeline parallelism splits layers as vLLM's ``get_pp_indices`` does: the remainder goes to the stages
  before the last, starting from the second-last; the first stage holds the embedding, the last the final
  norm and ``lm_head`` (a second copy of the embedding when the embeddings are tied and PP > 1).
- Quantization shrinks linear layers only; embeddings, ``lm_head``, routers and norms stay in the model
  dtype (see :func:`param_bytes` for each method's layout).
- The rotary cos/sin cache (``max_position x rotary_dim`` in the model dtype; two for Gemma 3's local and
  global RoPE) is counted: vLLM's "Model loading took" includes it.
- On an NVIDIA GPU every tensor counts as the block PyTorch's caching allocator gives it while vLLM loads
  (:mod:`gpufleet.planner.allocator`): the figure is ``memory_allocated()``, which counts blocks.
- KV bytes per token and layer: ``2 x KV heads per rank x head_dim x dtype`` for standard attention;
  ``(kv_lora_rank + qk_rope_head_dim) x dtype`` for MLA, whole on every tensor-parallel rank. Layers with
  a sliding window form their own KV-cache groups (vLLM's hybrid allocator, see
  :mod:`gpufleet.planner.kvcache`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.planner.base import (
    Param,
    PlannerInputError,
    PlannerUnmodelledError,
)
from gpufleet.planner.base import config_int as _int
from gpufleet.planner.base import config_opt_int as _opt_int
from gpufleet.planner.hf_defaults import with_hf_defaults
from gpufleet.planner.hybrid import (
    ATTENTION_KINDS,
    STATE_KINDS,
    MambaShape,
    StateMixer,
    Zamba2Blocks,
    parse_hybrid,
    parse_zamba2_blocks,
)
from gpufleet.planner.multimodal import MODELLED as MULTIMODAL_MODELLED
from gpufleet.planner.multimodal import VisionTower, parse_vision

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
# vLLM's quantization names (checkpoint quant_method or --quantization) -> the layout the planner sizes.
QUANTIZATION_ALIASES = {
    "bitsandbytes": "bitsandbytes",
    "fp8": "fp8",
    "fbgemm_fp8": "fp8",
    "modelopt": "fp8",
    "awq": "awq",
    "awq_marlin": "awq",
    "gptq": "gptq",
    "gptq_marlin": "gptq",
    "compressed-tensors": "compressed-tensors",
    "compressed_tensors": "compressed-tensors",
    "mxfp4": "mxfp4",
}
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
QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_5_vl", "qwen2_vl"})
QK_NORM_TYPES = frozenset(
    {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl_text", "qwen3_vl_moe_text", "gemma3_text", "gemma3"}
)
FOUR_NORM_TYPES = frozenset({"gemma2", "gemma3_text", "gemma3"})  # pre/post attention and feed-forward


@dataclass(frozen=True)
class MoeShape:
    """A mixture-of-experts MLP as vLLM builds it."""

    num_experts: int
    intermediate_size: int  # per expert
    top_k: int
    shared_intermediate_size: int = 0  # all shared experts together; 0 = none
    shared_expert_gate: bool = False  # Qwen2-MoE: a 1-output gate on the shared expert
    dense_layers: frozenset[int] = frozenset()  # layers with a dense MLP instead
    router_bias: bool = False  # gpt-oss
    expert_bias: bool = False  # gpt-oss
    score_bias: bool = False  # DeepSeek-V3's e_score_correction_bias (float32)
    # Nemotron-H's NemotronHMoE: ungated relu2 experts (is_act_and_mul=False: w13 is one matrix), a float32
    # router, an ungated shared expert (NemotronHMLP: up_proj, down_proj).
    ungated: bool = False


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0  # 0: q_proj straight from the hidden state

    @property
    def latent_dim(self) -> int:
        """Elements per token and layer in the KV cache: the latent plus the RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelArch:
    """The shape of a decoder-only transformer, as read from config.json."""

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
    architecture: str = ""
    moe: MoeShape | None = None
    mla: MlaShape | None = None
    # Per layer: its sliding window, or None for full attention.
    layer_windows: tuple[int | None, ...] = ()
    norms_per_layer: int = 2
    attention_sinks: bool = False
    rotary_caches: int = 1
    rotary_dtype_bytes: int = 0  # 0: the model dtype; gpt-oss builds its YaRN cache in float32
    # Hybrid state-space models: each layer's mixer ("attention" or "mamba"; Nemotron-H's blocks also "mlp",
    # a block with an MLP and no mixer). Empty: attention everywhere.
    layer_kinds: tuple[str, ...] = ()
    mamba: StateMixer | None = None
    # Qwen3-Next's gated attention: q_proj also yields a sigmoid gate per head (attn_output_gate).
    attention_output_gate: bool = False
    zamba2: Zamba2Blocks | None = None  # Zamba2's shared transformer blocks
    # Nemotron-H: a block is one mixer *or* one MLP, with one norm (no MLP beside a mixer).
    single_module_blocks: bool = False
    vision: VisionTower | None = None  # a multimodal model's vision tower and projector
    # Gemma 3's second (local, sliding-window) rotary cache: max_position_embeddings long, unscaled, where the
    # global one (LinearScalingRotaryEmbedding) is max_position x factor. 0 = as long as the first.
    local_rotary_positions: int = 0

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.moe.dense_layers

    def layer_kind(self, layer: int) -> str:
        return self.layer_kinds[layer] if self.layer_kinds else "attention"

    def is_attention_layer(self, layer: int) -> bool:
        """Whether the layer holds a KV cache (an attention mixer, alone or beside a Mamba one)."""
        return self.layer_kind(layer) in ATTENTION_KINDS

    def is_state_layer(self, layer: int) -> bool:
        """Whether the layer holds a fixed per-sequence state (Mamba, gated DeltaNet)."""
        return self.mamba is not None and self.layer_kind(layer) in STATE_KINDS

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None


@dataclass(frozen=True)
class Quantization:
    """How vLLM stores a linear layer's weight under one quantization method."""

    method: str  # bitsandbytes | fp8 | awq | gptq | int8 | mxfp4 (compressed-tensors resolves to these)
    bits: int = 4
    group_size: int = 128
    # bitsandbytes: absmax stored as uint8 (vLLM quantizes with compress_statistics=True).
    double_quant: bool = True
    block: tuple[int, int] | None = None  # fp8 checkpoints with block-wise scales
    per_channel: bool = False  # fp8/int8 with one scale per output row
    zero_points: bool = True  # AWQ and asymmetric GPTQ keep packed zeros
    online: bool = False  # --quantization fp8 on an unquantized checkpoint
    skip: tuple[str, ...] = ()  # module names left unquantized (ignore / modules_to_not_convert)
    experts_only: bool = False  # MXFP4 (gpt-oss) quantizes the experts only
    source: str = ""  # the method as config.json or --quantization named it
    # Hopper (compute capability 9.0): vLLM 0.24 re-lays some weights for its Hopper kernels after loading
    # (AWQ/GPTQ zero points for Machete, MXFP4 expert scales for the Triton MoE backend).
    hopper: bool = False


@dataclass(frozen=True)
class DerivedMaxLen:
    value: int
    source: str  # how vLLM words it: "max_position_embeddings=40960"


@dataclass(frozen=True)
class Parallelism:
    """How one GPU's share is cut: TP ranks, and experts spread whole with ``expert_parallel``."""

    tp: int = 1
    expert_parallel: bool = False
    data_parallel: int = 1

    @property
    def ep(self) -> int:
        return self.tp * self.data_parallel if self.expert_parallel else 1


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: multimodal wrappers keep it under ``text_config``."""
    inner = config.get("text_config") or config.get("llm_config")  # InternVLChatModel: llm_config
    if "hidden_size" not in config and isinstance(inner, dict):
        merged = dict(inner)
        for key in ("torch_dtype", "dtype", "quantization_config", "architectures", "tie_word_embeddings"):
            if key in config and key not in merged:
                merged[key] = config[key]
        return merged
    return config


def parse_arch(config: Mapping[str, Any]) -> ModelArch:
    """Read the shape of the model; raises PlannerInputError for configs the planner cannot model.

    A modelled multimodal model's language model is read from ``text_config`` (or the top level, where
    Qwen2.5-VL keeps it), its vision tower from ``vision_config`` (:mod:`gpufleet.planner.multimodal`)."""
    config = with_hf_defaults(config)  # the keys transformers' config class fills in
    _refuse_unsupported(config)
    vision = parse_vision(config)
    config = text_config(config)
    model_type = str(config.get("model_type", "unknown"))
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    kv_heads = config.get("num_key_value_heads")
    if kv_heads is None:
        kv_heads = 1 if config.get("multi_query") else heads
    head_dim = config.get("head_dim") or hidden // heads
    attention_bias = bool(config.get("attention_bias", False))
    layers = _int(config, "num_hidden_layers")
    mla = _parse_mla(config)
    moe = _parse_moe(config, layers)
    # Llama 4's dense layers use intermediate_size_mlp (intermediate_size is the experts').
    keys = ("intermediate_size_mlp",) if model_type == "llama4_text" else ("intermediate_size", "ffn_dim")
    intermediate = _opt_int(config, *keys) or (moe.intermediate_size if moe else 0)
    rotary = mla.qk_rope_head_dim if mla else int(head_dim * float(config.get("partial_rotary_factor", 1.0)))
    architectures = config.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(name, str) for name in architectures)
    ):
        raise PlannerInputError(
            f"config.json: architectures: found {architectures!r}; expected a list of class names such as "
            "['Qwen2ForCausalLM']. Fix: point the planner at the model's own config.json"
        )
    architecture = str(architectures[0]) if architectures else ""
    kinds, mamba = parse_hybrid(config, model_type, layers)
    zamba2 = parse_zamba2_blocks(config) if model_type == "zamba2" else None
    if zamba2 is not None:  # attention over 2 x hidden: heads of 2 x hidden / heads (Zamba2Config)
        head_dim, kv_heads, rotary = zamba2.head_dim, zamba2.num_kv_heads, zamba2.head_dim
        intermediate = zamba2.intermediate_size
    no_rotary = (
        model_type in {"nemotron_h", "jamba"}
        or (model_type == "zamba2" and not config.get("use_mem_rope", False))
        or (model_type == "granitemoehybrid" and config.get("position_embedding_type", "rope") != "rope")
    )
    return ModelArch(
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=_int({"intermediate_size": intermediate}, "intermediate_size"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=_int({"num_key_value_heads": kv_heads}, "num_key_value_heads"),
        head_dim=_int({"head_dim": head_dim}, "head_dim"),
        vocab_size=_int(config, "vocab_size"),
        # zamba2.py ties lm_head to the embedding whatever the config says.
        tie_embeddings=model_type == "zamba2"
        or bool(config.get("tie_word_embeddings", model_type in FOUR_NORM_TYPES)),
        # vLLM's Qwen2 attention always has q/k/v biases; Llama-style models follow attention_bias.
        qkv_bias=model_type in QKV_BIAS_TYPES or attention_bias,
        o_bias=attention_bias and model_type not in QKV_BIAS_TYPES,
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type in QK_NORM_TYPES,
        rotary_dim=rotary,
        architecture=architecture,
        moe=moe,
        mla=mla,
        layer_windows=_layer_windows(config, model_type, layers),
        norms_per_layer=4 if model_type in FOUR_NORM_TYPES else 2,
        attention_sinks=model_type == "gpt_oss",
        rotary_caches=0 if no_rotary else 2 if model_type in {"gemma3_text", "gemma3"} else 1,
        rotary_dtype_bytes=4 if model_type == "gpt_oss" else 0,  # vLLM's gpt_oss.py: get_rope(dtype=float32)
        layer_kinds=kinds,
        mamba=mamba,
        single_module_blocks=model_type == "nemotron_h",
        attention_output_gate=model_type == "qwen3_next" and bool(config.get("attn_output_gate", True)),
        zamba2=zamba2,
        vision=vision,
        local_rotary_positions=_opt_int(config, "max_position_embeddings")
        if model_type in {"gemma3_text", "gemma3"}
        else 0,
    )


def _parse_mla(config: Mapping[str, Any]) -> MlaShape | None:
    if not config.get("kv_lora_rank"):
        return None
    return MlaShape(
        kv_lora_rank=_int(config, "kv_lora_rank"),
        qk_rope_head_dim=_int(config, "qk_rope_head_dim"),
        qk_nope_head_dim=_int(config, "qk_nope_head_dim"),
        v_head_dim=_int(config, "v_head_dim"),
        q_lora_rank=_opt_int(config, "q_lora_rank"),
    )


def _parse_moe(config: Mapping[str, Any], layers: int) -> MoeShape | None:
    experts = _opt_int(config, "num_experts", "num_local_experts", "n_routed_experts")
    if not experts:
        return None
    model_type = str(config.get("model_type", ""))
    # Mixtral and gpt-oss size their experts with intermediate_size; the others with moe_intermediate_size.
    per_expert = _opt_int(config, "moe_intermediate_size", "intermediate_size")
    # Granite 4.0 H names its shared expert shared_intermediate_size (GraniteMoeSharedMLP).
    shared = _opt_int(config, "shared_expert_intermediate_size", "shared_intermediate_size")
    if not shared and _opt_int(config, "n_shared_experts"):
        shared = _opt_int(config, "n_shared_experts") * per_expert
    if model_type == "llama4_text":  # llama4.py: one shared expert as large as a routed one
        shared = shared or per_expert
    if model_type == "nemotron_h":  # nemotron_h.py: moe_shared_expert_intermediate_size x n_shared_experts
        shared = _opt_int(config, "moe_shared_expert_intermediate_size") * _opt_int(
            config, "n_shared_experts"
        )
    dense = set(range(min(_opt_int(config, "first_k_dense_replace"), layers)))
    only = config.get("mlp_only_layers")
    if isinstance(only, list):
        dense |= {int(layer) for layer in only if isinstance(layer, int)}
    step = _opt_int(config, "decoder_sparse_step", "moe_layer_freq", "interleave_moe_layer_step") or 1
    if step > 1:
        dense |= {layer for layer in range(layers) if (layer + 1) % step}
    if model_type == "jamba":  # jamba.py: layers_num_experts, MoE where layer % period == offset
        period = _opt_int(config, "expert_layer_period") or 2
        offset = config.get("expert_layer_offset", 1)
        dense |= {
            layer for layer in range(layers) if layer % period != (offset if isinstance(offset, int) else 1)
        }
    return MoeShape(
        num_experts=experts,
        intermediate_size=_int({"moe_intermediate_size": per_expert}, "moe_intermediate_size"),
        top_k=_opt_int(config, "num_experts_per_tok", "experts_per_token", "moe_topk") or 1,
        shared_intermediate_size=shared,
        shared_expert_gate=model_type in {"qwen2_moe", "qwen3_next"} and shared > 0,
        dense_layers=frozenset(dense),
        router_bias=model_type == "gpt_oss",
        expert_bias=model_type == "gpt_oss",
        score_bias=config.get("topk_method") == "noaux_tc" or model_type == "nemotron_h",
        ungated=model_type == "nemotron_h",
    )


def _layer_windows(  # noqa: PLR0911  (one return per family rule reads best)
    config: Mapping[str, Any], model_type: str, layers: int
) -> tuple[int | None, ...]:
    """Each layer's sliding window as vLLM 0.24 applies it (empty: full attention everywhere)."""
    chunk = _opt_int(config, "attention_chunk_size")
    rope_layers = config.get("no_rope_layers")
    if model_type == "llama4_text" and chunk and isinstance(rope_layers, list) and len(rope_layers) == layers:
        # llama4.py: the RoPE layers use ChunkedLocalAttention, whose KV cache holds about one chunk per
        # request (ChunkedLocalAttentionSpec, planned as a window of the chunk); the NoPE layers are global.
        return tuple(chunk if rope_layers[layer] else None for layer in range(layers))
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return ()
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return tuple(window if kind == "sliding_attention" else None for kind in types)
    if model_type in {"gemma3_text", "gemma3"}:
        pattern = _opt_int(config, "sliding_window_pattern") or 6
        return tuple(None if (layer + 1) % pattern == 0 else window for layer in range(layers))
    if model_type in {"gemma2", "cohere2"}:
        return tuple(window if layer % 2 == 0 else None for layer in range(layers))
    if model_type in {"mistral", "mixtral"} or (
        config.get("use_sliding_window") and model_type not in {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}
    ):
        return tuple(window for _ in range(layers))
    if config.get("use_sliding_window"):
        # Qwen2/Qwen3: layers from max_window_layers on use the window (as Hugging Face defines it).
        start = _opt_int(config, "max_window_layers")
        return tuple(window if layer >= start else None for layer in range(layers))
    return ()


def _refuse_unsupported(config: Mapping[str, Any]) -> None:
    architectures = config.get("architectures")
    name = str(architectures[0]) if isinstance(architectures, list) and architectures else "?"
    multimodal = isinstance(config.get("vision_config"), dict) or (
        "hidden_size" not in config and isinstance(config.get("text_config"), dict)
    )
    if multimodal and name not in MULTIMODAL_MODELLED and parse_vision(config) is None:
        modelled = ", ".join(MULTIMODAL_MODELLED)
        raise PlannerUnmodelledError(
            f"config.json: architectures: found the multimodal model {name}; expected a text-only decoder or "
            f"one of {modelled}, or a vision_config with the tower's hidden_size and num_hidden_layers. Fix: "
            "the planner does not model this family's vision tower; size this deployment by hand"
        )
    if config.get("num_nextn_predict_layers") and config.get("model_type") == "deepseek_v4":
        raise PlannerUnmodelledError(
            "config.json: model_type: found 'deepseek_v4'; expected a model the planner can size. "
            "Fix: the planner does not model DeepSeek-V4's compressed sparse attention; size it by hand"
        )


def config_dtype(config: Mapping[str, Any]) -> str | None:
    """The checkpoint's dtype as vLLM 0.24 finds it (``ModelArchConfigConvertorBase.get_torch_dtype``): the
    top level's, else the text config's, else the vision config's (multimodal configs nest it)."""
    for part in (config, config.get("text_config"), config.get("vision_config")):
        if isinstance(part, Mapping) and (raw := part.get("torch_dtype") or part.get("dtype")):
            return DTYPE_ALIASES.get(str(raw).lower())
    return None


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
    declared = checkpoint_quantization(config)
    name = (requested or declared or "").lower()
    if not name:
        return None
    if name not in QUANTIZATION_ALIASES:
        choices = ", ".join(QUANTIZATION_ALIASES)
        raise PlannerUnmodelledError(
            f"quantization: found {name!r}; expected one of {choices}. "
            "Fix: the planner models these methods only; size other methods by hand"
        )
    method = QUANTIZATION_ALIASES[name]
    quant = config.get("quantization_config")
    settings: Mapping[str, Any] = quant if isinstance(quant, dict) and declared else {}
    skip = _skipped_modules(settings)
    if method == "bitsandbytes":
        bits = 8 if settings.get("load_in_8bit") else 4
        double = bool(settings.get("bnb_4bit_use_double_quant", True))
        return Quantization(method, bits=bits, group_size=64, double_quant=double, skip=skip, source=name)
    if method == "fp8":
        block = settings.get("weight_block_size")
        block_shape = (int(block[0]), int(block[1])) if isinstance(block, list) and len(block) == 2 else None
        return Quantization(
            method, bits=8, group_size=0, block=block_shape, online=declared is None, skip=skip, source=name
        )
    if method == "mxfp4":
        return Quantization(method, bits=4, group_size=32, experts_only=True, skip=skip, source=name)
    if method == "compressed-tensors":
        return _compressed_tensors(settings, skip)
    bits = int(settings.get("bits", settings.get("w_bit", 4)))
    group = int(settings.get("group_size", settings.get("q_group_size", 128)))
    zero = bool(settings.get("zero_point", True)) if method == "awq" else not settings.get("sym", True)
    return Quantization(method, bits=bits, group_size=group, zero_points=zero, skip=skip, source=name)


def _skipped_modules(settings: Mapping[str, Any]) -> tuple[str, ...]:
    found: list[str] = []
    for key in ("modules_to_not_convert", "ignore", "ignored_layers", "llm_int8_skip_modules"):
        value = settings.get(key)
        if isinstance(value, list):
            found += [str(item) for item in value]
    return tuple(found)


def _compressed_tensors(settings: Mapping[str, Any], skip: tuple[str, ...]) -> Quantization:
    """compressed-tensors: the first config group's weight scheme decides the layout."""
    groups = settings.get("config_groups")
    weights: Mapping[str, Any] = {}
    if isinstance(groups, dict):
        for group in groups.values():
            if isinstance(group, dict) and isinstance(group.get("weights"), dict):
                weights = group["weights"]
                break
    bits = int(weights.get("num_bits", 8))
    kind = str(weights.get("type", "int"))
    strategy = str(weights.get("strategy", "tensor"))
    group_size = int(weights.get("group_size") or 0)
    if kind == "float" and bits == 8:
        block = weights.get("block_structure")
        block_shape = (int(block[0]), int(block[1])) if isinstance(block, list) and len(block) == 2 else None
        return Quantization(
            "fp8",
            bits=8,
            group_size=0,
            block=block_shape,
            per_channel=strategy == "channel",
            skip=skip,
            source="compressed-tensors",
        )
    if bits == 8 and strategy in {"channel", "tensor"}:
        return Quantization(
            "int8", bits=8, group_size=0, per_channel=True, skip=skip, source="compressed-tensors"
        )
    return Quantization(
        "gptq",
        bits=bits,
        group_size=group_size if strategy == "group" else 0,
        zero_points=not bool(weights.get("symmetric", True)),
        skip=skip,
        source="compressed-tensors",
    )


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


def _attention_params(arch: ModelArch, tp: int) -> list[Param]:
    q_heads, kv_heads = heads_per_rank(arch, tp)
    hidden = arch.hidden_size
    if arch.mla is not None:
        mla = arch.mla
        q_out = q_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        if mla.q_lora_rank:
            params = [
                Param("q_a_proj.weight", mla.q_lora_rank, hidden),
                Param("q_a_layernorm.weight", mla.q_lora_rank),
                Param("q_b_proj.weight", q_out, mla.q_lora_rank),
            ]
        else:
            params = [Param("q_proj.weight", q_out, hidden)]
        return [
            *params,
            Param("kv_a_proj_with_mqa.weight", mla.latent_dim, hidden),  # replicated on every rank
            Param("kv_a_layernorm.weight", mla.kv_lora_rank),
            Param("kv_b_proj.weight", q_heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
            Param("o_proj.weight", hidden, q_heads * mla.v_head_dim),
        ]
    # Qwen3-Next's q_proj yields the queries and their output gate (heads x head_dim x 2).
    qkv_out = (q_heads * (2 if arch.attention_output_gate else 1) + 2 * kv_heads) * arch.head_dim
    params = [Param("qkv_proj.weight", qkv_out, hidden, shards=3)]
    if arch.qkv_bias:
        params.append(Param("qkv_proj.bias", qkv_out))
    params.append(Param("o_proj.weight", hidden, q_heads * arch.head_dim))
    if arch.o_bias:
        params.append(Param("o_proj.bias", hidden))
    if arch.qk_norm:
        params += [Param("q_norm.weight", arch.head_dim), Param("k_norm.weight", arch.head_dim)]
    if arch.attention_sinks:
        params.append(Param("sinks", q_heads))  # torch.empty in the model dtype (vLLM's gpt_oss.py)
    return params


def _dense_mlp(arch: ModelArch, intermediate: int, tp: int, prefix: str = "") -> list[Param]:
    inter = math.ceil(intermediate / tp)
    hidden = arch.hidden_size
    params = [Param(f"{prefix}gate_up_proj.weight", 2 * inter, hidden, shards=2)]
    if arch.mlp_bias:
        params.append(Param(f"{prefix}gate_up_proj.bias", 2 * inter))
    params.append(Param(f"{prefix}down_proj.weight", hidden, inter))
    if arch.mlp_bias:
        params.append(Param(f"{prefix}down_proj.bias", hidden))
    return params


def local_experts(moe: MoeShape, par: Parallelism) -> int:
    """Experts on the busiest rank: all of them, or an equal share with expert parallelism."""
    return math.ceil(moe.num_experts / par.ep)


def _moe_mlp(arch: ModelArch, moe: MoeShape, par: Parallelism) -> list[Param]:
    hidden = arch.hidden_size
    experts = local_experts(moe, par)
    # Expert parallelism keeps each expert whole; otherwise every rank holds a slice of every expert.
    inter = moe.intermediate_size if par.ep > 1 else math.ceil(moe.intermediate_size / par.tp)
    # Nemotron-H's router is a float32 ReplicatedLinear (router_logits_dtype).
    params = [
        Param("gate.weight", moe.num_experts, hidden, quantizable=False, dtype_bytes=4 if moe.ungated else 0)
    ]
    if moe.router_bias:
        params.append(Param("gate.bias", moe.num_experts, quantizable=False))
    if moe.score_bias:
        params.append(
            Param("gate.e_score_correction_bias", moe.num_experts, quantizable=False, dtype_bytes=4)
        )
    gates = 1 if moe.ungated else 2  # is_act_and_mul=False: w13 holds the up projection alone
    params += [
        Param("experts.w13_weight", gates * inter, hidden, shards=gates, copies=experts),
        Param("experts.w2_weight", hidden, inter, copies=experts),
    ]
    if moe.expert_bias:
        params += [
            Param("experts.w13_bias", 2 * inter, copies=experts),
            Param("experts.w2_bias", hidden, copies=experts),
        ]
    if moe.shared_intermediate_size and moe.ungated:
        params += _relu2_mlp(arch, par.tp, moe.shared_intermediate_size, prefix="shared_experts.")
    elif moe.shared_intermediate_size:
        params += _dense_mlp(arch, moe.shared_intermediate_size, par.tp, prefix="shared_expert.")
    if moe.shared_expert_gate:
        params.append(Param("shared_expert_gate.weight", 1, hidden, quantizable=False))
    return params


def _relu2_mlp(arch: ModelArch, tp: int, intermediate: int = 0, prefix: str = "mixer.") -> list[Param]:
    """Nemotron-H's MLP block (and its MoE's shared expert, built without bias): up_proj and down_proj, no
    gate (squared ReLU)."""
    inter = math.ceil((intermediate or arch.intermediate_size) / tp)
    bias = arch.mlp_bias and prefix == "mixer."
    params = [Param(f"{prefix}up_proj.weight", inter, arch.hidden_size)]
    if bias:
        params.append(Param(f"{prefix}up_proj.bias", inter))
    params.append(Param(f"{prefix}down_proj.weight", arch.hidden_size, inter))
    if bias:
        params.append(Param(f"{prefix}down_proj.bias", arch.hidden_size))
    return params


def layer_params(arch: ModelArch, tp: int | Parallelism, layer: int = 0) -> list[Param]:
    """Decoder layer ``layer``'s parameters on one rank, in vLLM's registration order."""
    par = tp if isinstance(tp, Parallelism) else Parallelism(tp)
    kind = arch.layer_kind(layer)
    if arch.zamba2 is not None and isinstance(arch.mamba, MambaShape):
        return arch.zamba2.layer_params(arch.mamba, kind, par.tp)
    if arch.single_module_blocks:  # Nemotron-H: one mixer or MLP, one norm
        if kind == "mamba" and arch.mamba is not None:
            params = arch.mamba.params(arch.hidden_size, par.tp)
        elif kind == "mlp":
            params = _relu2_mlp(arch, par.tp)
        elif kind == "moe" and arch.moe is not None:
            params = _moe_mlp(arch, arch.moe, par)
        else:
            params = _attention_params(arch, par.tp)
        return [*params, Param("norm.weight", arch.hidden_size)]
    params = _attention_params(arch, par.tp) if arch.is_attention_layer(layer) else []
    if arch.mamba is not None and arch.is_state_layer(layer):  # Falcon-H1: both in one layer
        params += arch.mamba.params(arch.hidden_size, par.tp)
    if arch.moe is not None and arch.is_moe_layer(layer):
        params += _moe_mlp(arch, arch.moe, par)
    else:
        params += _dense_mlp(arch, arch.intermediate_size, par.tp)
    norms = (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    )
    params += [Param(f"{name}.weight", arch.hidden_size) for name in norms[: arch.norms_per_layer]]
    return params


# GPU names of compute capability 9.0 (H100, H200, H800, H20, GH200).
_HOPPER = re.compile(r"(^|[^a-z0-9])g?h(100|200|800|20)([^0-9]|$)")


def is_hopper(gpu_name: str) -> bool:
    """Whether the GPU is a Hopper (compute capability 9.0), from the name CUDA reports."""
    return bool(_HOPPER.search(gpu_name.lower()))


# NVIDIA names as CUDA reports them ("NVIDIA H100 80GB HBM3", "Tesla T4") or as people write them ("a100").
_NVIDIA = re.compile(
    r"nvidia|tesla|geforce|quadro|titan|(^|[^a-z0-9])(rtx|g?h(100|200|800|20)|a(100|800|10g?|30|40)|l(4|20|40s?)"
    r"|v100|t4|p100|g?b(100|200|300))([^0-9]|$)"
)


def is_nvidia(gpu_name: str) -> bool:
    """Whether the GPU runs vLLM's CUDA platform, from its name (a bare "GPU" says nothing)."""
    return bool(_NVIDIA.search(gpu_name.lower()))


def _is_quantized(param: Param, quant: Quantization) -> bool:
    if not param.is_linear or not param.quantizable:
        return False
    if quant.experts_only and param.copies == 1 and not param.name.startswith("experts."):
        return False
    module = param.name.rsplit(".", 1)[0]
    return not any(skip.rsplit(".", 1)[-1] in {module, module.split(".")[-1]} for skip in quant.skip)


def param_bytes(param: Param, dtype_bytes: int, quant: Quantization | None) -> tuple[int, int]:
    """(bytes of the parameter tensors, bytes of quantization state kept beside them on the GPU)."""
    tensors, state = _param_tensors(param, dtype_bytes, quant)
    return sum(tensors) * param.copies, sum(state) * param.copies


def param_tensors(param: Param, dtype_bytes: int, quant: Quantization | None) -> tuple[int, ...]:
    """Bytes of each GPU tensor vLLM keeps for the parameter on one rank (weight, scales, zero points,
    quantization state); fused experts are one tensor over all ``copies``. The sum is :func:`param_bytes`."""
    tensors, state = _param_tensors(param, dtype_bytes, quant)
    return tuple(size * param.copies for size in (*tensors, *state) if size)


def _param_tensors(
    param: Param, dtype_bytes: int, quant: Quantization | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(parameter tensors, quantization-state tensors) of one copy."""
    element = param.dtype_bytes or dtype_bytes
    expert_bias = param.name.startswith("experts.") and param.name.endswith("_bias")
    if quant is not None and _triton_mxfp4(quant) and expert_bias:
        element = 4  # the Triton MXFP4 MoE backend converts the expert biases to float32
    if quant is None or not _is_quantized(param, quant):
        numel = param.out_features * max(param.in_features, 1)
        return (numel * element,), ()
    return _quantized_tensors(param, quant)


def _quantized_tensors(  # noqa: PLR0911
    param: Param, quant: Quantization
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    out, in_ = param.out_features, param.in_features
    numel = out * in_
    if quant.method == "bitsandbytes":
        if quant.bits == 8:
            return (numel,), (out * 4,)  # int8 weight + one fp32 scale per row
        blocks = math.ceil(numel / quant.group_size)
        absmax = blocks + math.ceil(blocks / 256) * 4 if quant.double_quant else blocks * 4
        return (math.ceil(numel / 2),), (absmax,)  # two 4-bit values per byte; quant state is not a parameter
    if quant.method == "fp8":
        if quant.block is not None:
            rows, cols = quant.block
            return (numel, math.ceil(out / rows) * math.ceil(in_ / cols) * 4), ()
        if quant.per_channel:
            return (numel, out * 4), ()
        return (numel, 4 * param.shards, 0 if quant.online else 4), ()  # per-tensor scales (+ input scale)
    if quant.method == "int8":
        return (numel, out * 4), ()
    if quant.method == "mxfp4":
        e8m0 = [math.ceil(numel / 32)]  # one e8m0 scale per 32 weights
        if _triton_mxfp4(quant):
            # vLLM 0.24's Triton MXFP4 MoE backend (Hopper) swizzles the scales into a new tensor
            # (HopperMXScaleLayout: rows padded to 256, scale columns to 2) and keeps the loaded
            # w13/w2_weight_scale parameters too; the e2m1 values are swizzled in place of the old ones.
            e8m0.append(_round_up(out, 256) * _round_up(math.ceil(in_ / 32), 2))
        return (math.ceil(numel / 2), *e8m0), ()  # e2m1 pairs + scales
    groups = math.ceil(in_ / quant.group_size) if quant.group_size > 0 else 1
    packed = math.ceil(numel * quant.bits / 8)
    zeros = math.ceil(groups * out * quant.bits / 8) if quant.zero_points else 0
    if quant.zero_points and _machete(quant, in_, out):
        # Machete (Hopper) stores the zero points pre-multiplied by the scales, in fp16/bf16:
        # ``-scale x zero`` per group and output column (MacheteLinearKernel.transform_w_zp).
        zeros = groups * out * 2
    scales = groups * out * 2  # fp16 scales
    return (packed, zeros, scales), ()


def _round_up(value: int, multiple: int) -> int:
    return math.ceil(value / multiple) * multiple


def _triton_mxfp4(quant: Quantization) -> bool:
    """vLLM 0.24 serves gpt-oss's MXFP4 experts with its Triton backend on Hopper (the FlashInfer and
    AITER backends need Blackwell or ROCm)."""
    return quant.method == "mxfp4" and quant.hopper


def _machete(quant: Quantization, in_features: int, out_features: int) -> bool:
    """Whether vLLM 0.24 picks the Machete kernel for an AWQ/GPTQ linear layer (choose_mp_linear_kernel
    tries it first): Hopper, 4 or 8 bits, group size -1/64/128, in x out divisible by 64 x 128."""
    return (
        quant.hopper
        and quant.method in {"awq", "gptq"}
        and quant.bits in {4, 8}
        and quant.group_size in {-1, 0, 64, 128}
        and in_features % 64 == 0
        and out_features % 128 == 0
    )


def vocab_per_rank(arch: ModelArch, tp: int) -> int:
    """Rows of the embedding (and lm_head) on one rank: vocab padded to 64, split over TP."""
    padded = math.ceil(arch.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    return math.ceil(padded / tp)


def kv_bytes_per_token_layer(arch: ModelArch, tp: int, kv_dtype_bytes: int) -> int:
    """KV-cache bytes one token takes in one attention layer on one rank."""
    if arch.mla is not None:
        return arch.mla.latent_dim * kv_dtype_bytes  # one latent, whole on every rank
    _, kv_heads = heads_per_rank(arch, tp)
    return 2 * kv_heads * arch.head_dim * kv_dtype_bytes


def kv_bytes_per_token(arch: ModelArch, layers: int, tp: int, kv_dtype_bytes: int) -> int:
    """Bytes per token of ``layers`` full-attention layers on one GPU: K and V per KV head per rank
    (``2 x layers x KV heads per rank x head_dim x bytes``), or the MLA latent (``layers x (kv_lora_rank +
    qk_rope_head_dim) x bytes``)."""
    return layers * kv_bytes_per_token_layer(arch, tp, kv_dtype_bytes)


def iter_layer_bytes(
    arch: ModelArch,
    tp: int | Parallelism,
    layers: int | Sequence[int],
    dtype_bytes: int,
    quant: Quantization | None,
) -> Iterator[tuple[int, int, int]]:
    """(layer index on this GPU, parameter bytes, quant-state bytes) per parameter, in load order."""
    for position, tensor, state, _ in iter_layer_tensors(arch, tp, layers, dtype_bytes, quant):
        yield position, tensor, state


def iter_layer_tensors(
    arch: ModelArch,
    tp: int | Parallelism,
    layers: int | Sequence[int],
    dtype_bytes: int,
    quant: Quantization | None,
) -> Iterator[tuple[int, int, int, tuple[int, ...]]]:
    """:func:`iter_layer_bytes` plus the bytes of each GPU tensor of the parameter (:func:`param_tensors`)."""
    indices = range(layers) if isinstance(layers, int) else layers
    cache: dict[tuple[bool, str], list[tuple[int, int, tuple[int, ...]]]] = {}
    for position, layer in enumerate(indices):
        kind = (arch.is_moe_layer(layer), arch.layer_kind(layer))
        if kind not in cache:
            cache[kind] = [
                (*param_bytes(param, dtype_bytes, quant), param_tensors(param, dtype_bytes, quant))
                for param in layer_params(arch, tp, layer)
            ]
        for tensor, state, tensors in cache[kind]:
            yield position, tensor, state, tensors
