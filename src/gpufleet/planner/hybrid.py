"""Hybrid models' state layers, as vLLM 0.24 builds them: which layers hold a fixed per-sequence state instead
of (or beside) a KV cache, that state's size, and the layer's weights.

Read from vLLM 0.24.0's code:

- Mamba-2 (``layers/mamba/mamba_mixer2.py``, ``MambaMixer2``): Nemotron-H (``nemotron_h.py``), Granite 4.0 H
  (``granitemoehybrid.py``) and Falcon-H1 (``falcon_h1.py``, where every layer runs attention *and* a Mamba-2
  mixer side by side, ``FalconH1ParallelHybrid``, so each layer holds both a KV cache and a Mamba state).
- Mamba-1 (``layers/mamba/mamba_mixer.py``, ``MambaMixer``): Jamba (``jamba.py``: attention every
  ``attn_layer_period`` layers from ``attn_layer_offset``, the others Mamba; MoE every ``expert_layer_period``
  layers from ``expert_layer_offset``). Its linear layers are built without ``quant_config``.
- Zamba2 (``zamba2.py``): a Mamba-2 layer everywhere, the "hybrid" layers after a shared transformer block
  (:class:`Zamba2Blocks`), each with its own KV cache.
- Gated DeltaNet (``layers/mamba/gdn/qwen_gdn_linear_attn.py``, ``QwenGatedDeltaNetAttention``): Qwen3-Next
  (``qwen3_next.py``: ``layer_types`` or one full-attention layer every ``full_attention_interval``).

The state per sequence and layer is ``MambaStateShapeCalculator``'s (``layers/mamba/mamba_utils.py``): a
conv state of ``conv_kernel - 1`` columns plus the temporal (SSM or recurrent) state, both in the model dtype
unless ``mamba_ssm_cache_dtype`` is set (``MambaStateDtypeCalculator``; Nemotron-H's config class sets
float32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.planner.base import Param, PlannerInputError, PlannerUnmodelledError, config_int, config_opt_int

# Layer kinds: "attention" (a KV cache), "mamba" (a state layer), "parallel" (both, Falcon-H1), "mlp" (a
# Nemotron-H block without a mixer).
# Zamba2: "zamba_hybrid" (a Mamba-2 layer after the shared transformer block, with its own KV cache),
# "zamba_hybrid_shared" (the first use of a shared block, which also holds the block's weights).
ATTENTION_KINDS = frozenset({"attention", "parallel", "zamba_hybrid", "zamba_hybrid_shared"})
STATE_KINDS = frozenset({"mamba", "parallel", "zamba_hybrid", "zamba_hybrid_shared"})


@dataclass(frozen=True)
class MambaShape:
    """A Mamba-2 mixer (vLLM's ``MambaMixer2``) as a hybrid model's state-space layers build it."""

    num_heads: int
    head_dim: int
    state_size: int  # N: ssm_state_size / mamba_d_state
    n_groups: int
    conv_kernel: int
    intermediate_size: int  # num_heads x head_dim (Nemotron-H), mamba_expand x hidden (Granite), mamba_d_ssm
    conv_bias: bool = True
    proj_bias: bool = False
    # The temporal (SSM) state's dtype when vLLM fixes it: Nemotron-H's is float32
    # (NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE); 0 = the model dtype (mamba_cache_dtype
    # auto).
    ssm_state_dtype_bytes: int = 0
    gated_norm: bool = True  # Mixer2RMSNormGated has a weight (use_rms_norm; Falcon-H1's mamba_rms_norm)
    mup_vector: bool = False  # Falcon-H1's zxbcdt multipliers: a buffer as long as in_proj's output

    def groups(self, tp: int) -> int:
        """n_groups as each rank holds them: vLLM replicates a single group so that it follows the head
        shards (``MambaStateShapeCalculator.extra_groups_for_head_shards``)."""
        return self.n_groups if self.n_groups % tp == 0 else tp

    def conv_dim(self, tp: int) -> int:
        """Channels of the depthwise convolution on one rank: x, B and C."""
        return (self.intermediate_size + 2 * self.groups(tp) * self.state_size) // tp

    def state_bytes(self, tp: int, dtype_bytes: int) -> int:
        """One sequence's state in one Mamba layer on one rank (vLLM's MambaSpec page before padding): the
        conv state ``(conv_kernel - 1) x conv_dim`` in the model dtype plus the SSM state ``heads x head_dim x
        state_size`` (``mamba2_state_shape``)."""
        conv = (self.conv_kernel - 1) * self.conv_dim(tp) * dtype_bytes
        ssm = (
            self.num_heads
            // tp
            * self.head_dim
            * self.state_size
            * (self.ssm_state_dtype_bytes or dtype_bytes)
        )
        return conv + ssm

    def params(self, hidden: int, tp: int) -> list[Param]:
        """``MambaMixer2`` on one rank: in_proj (z, x, B, C, dt), the depthwise conv1d (never quantized: built
        with quant_config=None), A (float32), D, dt_bias, out_proj and the gated RMSNorm's weight."""
        heads = self.num_heads // tp
        inner = self.intermediate_size // tp
        conv = self.conv_dim(tp)
        in_out = inner + conv + heads
        params = [Param("mixer.in_proj.weight", in_out, hidden, shards=5)]
        if self.proj_bias:
            params.append(Param("mixer.in_proj.bias", in_out))
        params.append(Param("mixer.conv1d.weight", conv, self.conv_kernel, quantizable=False))
        if self.conv_bias:
            params.append(Param("mixer.conv1d.bias", conv))
        params += [
            Param("mixer.A", heads, dtype_bytes=4),
            Param("mixer.D", heads),
            Param("mixer.dt_bias", heads),
            Param("mixer.out_proj.weight", hidden, inner),
        ]
        if self.proj_bias:
            params.append(Param("mixer.out_proj.bias", hidden))
        if self.gated_norm:
            params.append(Param("mixer.norm.weight", inner))
        if self.mup_vector:
            # falcon_h1.py: torch.ones(1, (2 x d_ssm + 2 x groups x state + heads) // tp), a buffer
            groups_state = self.groups(tp) * self.state_size
            params.append(
                Param("mup_vector", (2 * self.intermediate_size + 2 * groups_state + self.num_heads) // tp)
            )
        return params


@dataclass(frozen=True)
class Mamba1Shape:
    """A Mamba-1 mixer (vLLM's ``MambaMixer``, Jamba): in_proj to x and z, conv1d, x_proj to dt, B and C,
    dt_proj, A and D per channel and state, out_proj, and RMSNorms on dt, B and C."""

    intermediate_size: int  # mamba_expand x hidden
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool = True
    proj_bias: bool = False

    def state_bytes(self, tp: int, dtype_bytes: int) -> int:
        """``mamba1_state_shape``: conv ``(conv_kernel - 1) x intermediate / tp`` plus SSM ``intermediate / tp
        x state_size``, both in the model dtype (``mamba_cache_dtype`` / ``mamba_ssm_cache_dtype`` auto)."""
        inner = self.intermediate_size // tp
        return (self.conv_kernel - 1) * inner * dtype_bytes + inner * self.state_size * dtype_bytes

    def params(self, hidden: int, tp: int) -> list[Param]:
        """``MambaMixer`` on one rank; none of its linear layers takes ``quant_config``."""
        inner = self.intermediate_size // tp
        params = [Param("mamba.conv1d.weight", inner, self.conv_kernel, quantizable=False)]
        if self.conv_bias:
            params.append(Param("mamba.conv1d.bias", inner))
        params.append(Param("mamba.in_proj.weight", 2 * inner, hidden, shards=2, quantizable=False))
        if self.proj_bias:
            params.append(Param("mamba.in_proj.bias", 2 * inner))
        params += [
            Param("mamba.x_proj.weight", self.dt_rank + 2 * self.state_size, inner, quantizable=False),
            Param("mamba.dt_proj.weight", inner, self.dt_rank, quantizable=False),
            Param("mamba.dt_proj.bias", inner),
            Param("mamba.A", inner, self.state_size, quantizable=False, dtype_bytes=4),
            Param("mamba.D", inner),
            Param("mamba.out_proj.weight", hidden, inner, quantizable=False),
        ]
        if self.proj_bias:
            params.append(Param("mamba.out_proj.bias", hidden))
        params += [
            Param("mamba.dt_layernorm.weight", self.dt_rank),
            Param("mamba.b_layernorm.weight", self.state_size),
            Param("mamba.c_layernorm.weight", self.state_size),
        ]
        return params


@dataclass(frozen=True)
class GatedDeltaNetShape:
    """Qwen3-Next's gated DeltaNet (``QwenGatedDeltaNetAttention``)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @property
    def conv_channels(self) -> int:
        """q, k and v: ``2 x key_dim + value_dim``."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def state_bytes(self, tp: int, dtype_bytes: int) -> int:
        """``gated_delta_net_state_shape``: conv ``(conv_kernel - 1) x conv_dim / tp`` plus the recurrent
        state ``v_heads / tp x head_v_dim x head_k_dim``, both in the model dtype by default."""
        conv = (self.conv_kernel - 1) * (self.conv_channels // tp) * dtype_bytes
        return conv + self.num_v_heads // tp * self.head_v_dim * self.head_k_dim * dtype_bytes

    def params(self, hidden: int, tp: int) -> list[Param]:
        """One rank's share: in_proj_qkvz, in_proj_ba (b and a per value head), the conv1d (no bias, no
        quant_config), dt_bias, A_log (float32), the gated RMSNorm over head_v_dim, out_proj."""
        key = self.num_k_heads * self.head_k_dim // tp
        value = self.num_v_heads * self.head_v_dim // tp
        heads = self.num_v_heads // tp
        return [
            Param("linear_attn.conv1d.weight", self.conv_channels // tp, self.conv_kernel, quantizable=False),
            Param("linear_attn.in_proj_qkvz.weight", 2 * key + 2 * value, hidden, shards=4),
            Param("linear_attn.in_proj_ba.weight", 2 * heads, hidden),
            Param("linear_attn.dt_bias", heads),
            Param("linear_attn.A_log", heads, dtype_bytes=4),
            Param("linear_attn.norm.weight", self.head_v_dim),
            Param("linear_attn.out_proj.weight", hidden, value),
        ]


StateMixer = MambaShape | Mamba1Shape | GatedDeltaNetShape


@dataclass(frozen=True)
class Zamba2Blocks:
    """Zamba2's shared transformer blocks (vLLM's zamba2.py, sizes as transformers' Zamba2Config derives
    them): ``num_mem_blocks`` blocks cycled over the hybrid layers; each block is attention over the
    concatenated ``2 x hidden`` input (``qkv_proj`` to ``heads x attention_head_dim`` each for q, k and v,
    ``o_proj`` back to hidden, no biases), a gated GELU MLP (biases with ``add_bias_linear``) and two RMSNorms
    (``2 x hidden`` and hidden). Every hybrid layer keeps, beside its Mamba-2 layer, a ``hidden x hidden``
    ``linear``, the MLP's LoRA adapter (``hidden -> adapter_rank -> 2 x intermediate``) and, with
    ``use_shared_attention_adapter``, q/k/v adapters (``2 x hidden -> rank -> 2 x hidden``), and its own
    Attention (KV cache). ``lm_head`` is always tied to the embedding."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    adapter_rank: int
    attention_adapters: bool
    bias: bool

    def layer_params(self, mamba: MambaShape, kind: str, tp: int) -> list[Param]:
        hidden, rank = self.hidden_size, self.adapter_rank
        params = [*mamba.params(hidden, tp), Param("input_layernorm.weight", hidden)]
        if kind == "mamba":
            return params
        inter = self.intermediate_size // tp
        params += [
            Param("linear.weight", hidden, hidden),  # ReplicatedLinear
            Param("gate_up_proj_adapter.A.weight", -(-rank // tp), hidden),
            Param("gate_up_proj_adapter.B.weight", 2 * inter, rank, shards=2),
        ]
        if self.attention_adapters:
            for name in ("q", "k", "v"):
                params += [
                    Param(f"linear_{name}_adapter.A.weight", -(-rank // tp), 2 * hidden),
                    Param(f"linear_{name}_adapter.B.weight", 2 * hidden // tp, rank),
                ]
        if kind == "zamba_hybrid_shared":
            heads, kv_heads = -(-self.num_heads // tp), max(1, -(-self.num_kv_heads // tp))
            params += [
                Param(
                    "self_attn.qkv_proj.weight", (heads + 2 * kv_heads) * self.head_dim, 2 * hidden, shards=3
                ),
                Param("self_attn.o_proj.weight", hidden, 2 * hidden // tp),
                Param("feed_forward.gate_up_proj.weight", 2 * inter, hidden, shards=2),
                Param("feed_forward.down_proj.weight", hidden, inter),
                Param("shared.input_layernorm.weight", 2 * hidden),
                Param("shared.pre_ff_layernorm.weight", hidden),
            ]
            if self.bias:
                params += [
                    Param("feed_forward.gate_up_proj.bias", 2 * inter),
                    Param("feed_forward.down_proj.bias", hidden),
                ]
        return params


def parse_zamba2_blocks(config: Mapping[str, Any]) -> Zamba2Blocks:
    """transformers' Zamba2Config: intermediate_size 4 x hidden when missing, attention_head_dim 2 x hidden /
    heads, num_key_value_heads = heads when missing."""
    hidden = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    return Zamba2Blocks(
        hidden_size=hidden,
        intermediate_size=config_opt_int(config, "intermediate_size") or 4 * hidden,
        num_heads=heads,
        num_kv_heads=config_opt_int(config, "num_key_value_heads") or heads,
        head_dim=config_opt_int(config, "attention_head_dim") or 2 * hidden // heads,
        adapter_rank=config_opt_int(config, "adapter_rank") or 128,
        attention_adapters=bool(config.get("use_shared_attention_adapter", False)),
        bias=bool(config.get("add_bias_linear", False)),
    )


# Hybrid families vLLM 0.24 serves whose state-space or linear-attention layers the planner does not build
# yet.
UNMODELLED_HYBRIDS = {
    "plamo2": "PLaMo 2",
    "lfm2": "LFM2",
    "kimi_linear": "Kimi Linear",
}
# Hybrid families vLLM 0.24 no longer serves (registry.py's _PREVIOUSLY_SUPPORTED_MODELS: removed in 0.23.0).
REMOVED_HYBRIDS = {
    "minimax": "MiniMax (lightning attention)",
    "minimax_m1": "MiniMax (lightning attention)",
    "minimax_text_01": "MiniMax (lightning attention)",
    "bamba": "Bamba",
}
NEMOTRON_H_BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def parse_hybrid(
    config: Mapping[str, Any], model_type: str, layers: int
) -> tuple[tuple[str, ...], StateMixer | None]:
    """Layer kinds and the state mixer of a hybrid model; nothing for a transformer."""
    if model_type in UNMODELLED_HYBRIDS:
        raise PlannerUnmodelledError(
            f"config.json: model_type: found {model_type!r} ({UNMODELLED_HYBRIDS[model_type]}); expected a "
            "model the planner can size. Fix: the planner models the hybrids Nemotron-H, Granite 4.0 H, "
            "Falcon-H1, Jamba, Qwen3-Next and Zamba2 only; size this one by hand"
        )
    if model_type in REMOVED_HYBRIDS:
        # Unmodelled, not a wrong input: a fleet pinned to an older vLLM image may serve it (validate warns).
        raise PlannerUnmodelledError(
            f"config.json: model_type: found {model_type!r} ({REMOVED_HYBRIDS[model_type]}); expected a "
            "model vLLM 0.24.0 serves: vLLM removed this family in 0.23.0 (registry.py, "
            "_PREVIOUSLY_SUPPORTED_MODELS). Fix: serve it with vLLM 0.22 or older, outside what this planner "
            "predicts"
        )
    parse = _PARSERS.get(model_type)
    return parse(config, layers) if parse else ((), None)


def _nemotron_h(config: Mapping[str, Any], layers: int) -> tuple[tuple[str, ...], StateMixer | None]:
    pattern = str(config.get("hybrid_override_pattern", ""))
    if len(pattern) != layers or any(char not in NEMOTRON_H_BLOCKS for char in pattern):
        raise PlannerInputError(
            f"config.json: hybrid_override_pattern: found {pattern!r}; expected one of M, *, -, E per "
            f"layer ({layers}). Fix: point the planner at the model's own config.json"
        )
    if "E" in pattern and not config_opt_int(config, "n_routed_experts"):
        raise PlannerInputError(
            "config.json: n_routed_experts: found nothing; expected the experts of the MoE blocks (E) of "
            "hybrid_override_pattern. Fix: point the planner at the model's own config.json"
        )
    if "E" in pattern and config.get("moe_latent_size"):
        raise PlannerUnmodelledError(
            "config.json: moe_latent_size: found a latent MoE (fc1/fc2_latent_proj); expected Nemotron-H's "
            "MoE blocks on the hidden size. Fix: the planner does not model the latent MoE yet; size it by "
            "hand"
        )
    heads = config_int(config, "mamba_num_heads")
    head_dim = config_int(config, "mamba_head_dim")
    return tuple(NEMOTRON_H_BLOCKS[char] for char in pattern), MambaShape(
        num_heads=heads,
        head_dim=head_dim,
        state_size=config_opt_int(config, "ssm_state_size") or 128,
        n_groups=config_opt_int(config, "n_groups", "mamba_n_groups") or 8,
        conv_kernel=config_opt_int(config, "conv_kernel", "mamba_d_conv") or 4,
        intermediate_size=heads * head_dim,
        conv_bias=bool(config.get("use_conv_bias", config.get("mamba_conv_bias", True))),
        proj_bias=bool(config.get("use_bias", False)),
        ssm_state_dtype_bytes=_ssm_dtype_bytes(config.get("mamba_ssm_cache_dtype", "float32")),
    )


def _granite(config: Mapping[str, Any], layers: int) -> tuple[tuple[str, ...], StateMixer | None]:
    types = config.get("layer_types")
    if not isinstance(types, list) or len(types) != layers:
        raise PlannerInputError(
            f"config.json: layer_types: found {types!r}; expected 'mamba' or 'attention' per layer "
            f"({layers}). Fix: point the planner at the model's own config.json"
        )
    kinds = tuple("mamba" if kind == "mamba" else "attention" for kind in types)
    if "mamba" not in kinds:  # granite-4.0-micro: the hybrid class with attention only
        return (), None
    return kinds, MambaShape(
        num_heads=config_int(config, "mamba_n_heads"),
        head_dim=config_int(config, "mamba_d_head"),
        state_size=config_opt_int(config, "mamba_d_state") or 128,
        n_groups=config_opt_int(config, "mamba_n_groups") or 1,
        conv_kernel=config_opt_int(config, "mamba_d_conv") or 4,
        intermediate_size=(config_opt_int(config, "mamba_expand") or 2) * config_int(config, "hidden_size"),
        conv_bias=bool(config.get("mamba_conv_bias", True)),
        proj_bias=bool(config.get("mamba_proj_bias", False)),
    )


def _falcon_h1(config: Mapping[str, Any], layers: int) -> tuple[tuple[str, ...], StateMixer | None]:
    """falcon_h1.py: every layer is attention and Mamba-2 side by side; ``d_ssm`` is ``mamba_d_ssm`` or
    ``mamba_expand x hidden``; the head size ``mamba_d_head`` (``d_ssm / heads`` when "auto")."""
    heads = config_int(config, "mamba_n_heads")
    d_ssm = config_opt_int(config, "mamba_d_ssm") or (
        config_opt_int(config, "mamba_expand") or 2
    ) * config_int(config, "hidden_size")
    return ("parallel",) * layers, MambaShape(
        num_heads=heads,
        head_dim=config_opt_int(config, "mamba_d_head") or d_ssm // heads,
        state_size=config_opt_int(config, "mamba_d_state") or 256,
        n_groups=config_opt_int(config, "mamba_n_groups") or 1,
        conv_kernel=config_opt_int(config, "mamba_d_conv") or 4,
        intermediate_size=d_ssm,
        conv_bias=bool(config.get("mamba_conv_bias", True)),
        proj_bias=bool(config.get("mamba_proj_bias", False)),
        gated_norm=bool(config.get("mamba_rms_norm", False)),
        mup_vector=True,
    )


def _jamba(config: Mapping[str, Any], layers: int) -> tuple[tuple[str, ...], StateMixer | None]:
    """jamba.py: attention where ``layer % attn_layer_period == attn_layer_offset``, Mamba-1 elsewhere;
    ``mamba_dt_rank`` "auto" is ``ceil(hidden / 16)`` (Hugging Face's JambaConfig)."""
    hidden = config_int(config, "hidden_size")
    period = config_opt_int(config, "attn_layer_period") or 8
    offset = config.get("attn_layer_offset", 4)
    offset = offset if isinstance(offset, int) else 4
    kinds = tuple("attention" if layer % period == offset else "mamba" for layer in range(layers))
    return kinds, Mamba1Shape(
        intermediate_size=(config_opt_int(config, "mamba_expand") or 2) * hidden,
        state_size=config_opt_int(config, "mamba_d_state") or 16,
        conv_kernel=config_opt_int(config, "mamba_d_conv") or 4,
        dt_rank=config_opt_int(config, "mamba_dt_rank") or math.ceil(hidden / 16),
        conv_bias=bool(config.get("mamba_conv_bias", True)),
        proj_bias=bool(config.get("mamba_proj_bias", False)),
    )


def _qwen3_next(config: Mapping[str, Any], layers: int) -> tuple[tuple[str, ...], StateMixer | None]:
    """qwen3_next.py: ``layer_types`` ("linear_attention" / "full_attention"), or Hugging Face's default of
    one full-attention layer every ``full_attention_interval``."""
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        kinds = tuple("mamba" if kind == "linear_attention" else "attention" for kind in types)
    else:
        interval = config_opt_int(config, "full_attention_interval") or 4
        kinds = tuple("attention" if (layer + 1) % interval == 0 else "mamba" for layer in range(layers))
    return kinds, GatedDeltaNetShape(
        num_k_heads=config_int(config, "linear_num_key_heads"),
        num_v_heads=config_int(config, "linear_num_value_heads"),
        head_k_dim=config_int(config, "linear_key_head_dim"),
        head_v_dim=config_int(config, "linear_value_head_dim"),
        conv_kernel=config_opt_int(config, "linear_conv_kernel_dim") or 4,
    )


def _zamba2(config: Mapping[str, Any], layers: int) -> tuple[tuple[str, ...], StateMixer | None]:
    """zamba2.py: every layer is a Mamba-2 layer; the "hybrid" ones (``layers_block_type``, transformers'
    default pattern when missing) run a shared transformer block first."""
    types = config.get("layers_block_type")
    if not isinstance(types, list) or len(types) != layers:
        types = [
            "mamba",
            *(["mamba"] * 5 + ["hybrid"]) * 7,
            *["mamba"] * 4,
            "hybrid",
            *["mamba"] * 3,
            "hybrid",
        ]
        types += ["mamba"] * 2
        if len(types) != layers:
            raise PlannerInputError(
                f"config.json: layers_block_type: found {config.get('layers_block_type')!r}; expected "
                f"'mamba' or 'hybrid' per layer ({layers}). Fix: point the planner at the model's own "
                "config.json"
            )
    shared = config_opt_int(config, "num_mem_blocks") or 1
    kinds: list[str] = []
    for kind in types:
        used = sum(1 for seen in kinds if seen != "mamba")
        kinds.append(
            "mamba" if kind != "hybrid" else "zamba_hybrid_shared" if used < shared else "zamba_hybrid"
        )
    hidden = config_int(config, "hidden_size")
    inner = (config_opt_int(config, "mamba_expand") or 2) * hidden
    heads = config_opt_int(config, "n_mamba_heads") or 8
    return tuple(kinds), MambaShape(
        num_heads=heads,
        head_dim=inner // heads,
        state_size=config_opt_int(config, "mamba_d_state") or 64,
        n_groups=config_opt_int(config, "mamba_ngroups") or 1,
        conv_kernel=config_opt_int(config, "mamba_d_conv") or 4,
        intermediate_size=inner,
        conv_bias=bool(config.get("use_conv_bias", True)),
        proj_bias=bool(config.get("add_bias_linear", False)),
    )


_PARSERS = {
    "zamba2": _zamba2,
    "nemotron_h": _nemotron_h,
    "granitemoehybrid": _granite,
    "falcon_h1": _falcon_h1,
    "jamba": _jamba,
    "qwen3_next": _qwen3_next,
}


def _ssm_dtype_bytes(name: object) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(name), 0)
