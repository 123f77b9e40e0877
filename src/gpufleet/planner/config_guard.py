"""A model's config.json checked before the planner reads it: on any JSON document, a one-line refusal, never
a traceback or a hang.

JSON text: nesting bounded (:data:`MAX_DEPTH`, checked on the text before Python's recursive parser sees it),
a key twice in one object refused by name (``json`` keeps the last one without a word). Values: every key the
planner reads as a number (:data:`NUMBERS`, in the top level and in the nested sections vLLM reads:
``text_config``, ``vision_config``, ``rope_scaling``, ``quantization_config``, ...) is a JSON number of the
right kind in its range (a string, a boolean, a list where a number belongs is refused, as is a count so
large that planning it would not end); KV heads divide the attention heads; a mixture of experts has experts
and routes each token to at most all of them; ``torch_dtype`` is a dtype vLLM loads (an unknown one is named,
not taken as float32).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpufleet.planner.arch import DTYPE_ALIASES
from gpufleet.planner.base import PlannerInputError

MAX_DEPTH = 32  # a real config.json nests 3 or 4 levels; Python's parser recurses once per level
# Sections vLLM and transformers read numbers from, below the top level.
SECTIONS = (
    "text_config",
    "llm_config",
    "language_config",
    "vision_config",
    "rope_scaling",
    "rope_parameters",
    "quantization_config",
)
BIG = 2**31 - 1  # no dimension of a model is larger; planning a larger one would loop for ever
LAYERS = 100_000
# key -> (kind, lowest, highest); None (JSON null) is always allowed: the key is then absent to the planner.
NUMBERS: dict[str, tuple[type, float, float]] = {
    **dict.fromkeys(
        (
            "hidden_size",
            "vocab_size",
            "max_position_embeddings",
            "original_max_position_embeddings",
            "kv_lora_rank",
            "q_lora_rank",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "v_head_dim",
            "head_dim",
            "mamba_head_dim",
            "mamba_headdim",
            "mamba_expand",
            "mamba_dt_rank",
            "mamba_d_state",
            "ssm_state_size",
            "mamba_d_conv",
            "conv_kernel",
            "patch_size",
            "spatial_merge_size",
            "temporal_patch_size",
        ),
        (int, 1, BIG),
    ),
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "mamba_num_heads",
            "mamba_n_heads",
            "n_mamba_heads",
            "mamba_ngroups",
            "mamba_n_groups",
            "n_groups",
            "depth",
            "num_heads",
        ),
        (int, 1, LAYERS),
    ),
    **dict.fromkeys(
        (
            "num_experts",
            "num_local_experts",
            "n_routed_experts",
            "num_experts_per_tok",
            "n_shared_experts",
            "num_nextn_predict_layers",
            "first_k_dense_replace",
        ),
        (int, 0, LAYERS),
    ),
    "bits": (int, 1, 64),
    "group_size": (int, -1, BIG),  # GPTQ's -1: one group per row
    **dict.fromkeys(
        (
            "intermediate_size",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "intermediate_size_mlp",
        ),
        (int, 0, BIG),  # 0: no such MLP (a shared expert switched off)
    ),
    "sliding_window": (int, 0, BIG),
    "factor": (float, 1e-6, 1e6),
    "partial_rotary_factor": (float, 1e-6, 1.0),
}
# Keys the planner needs a number for when they are there: JSON null is refused (elsewhere null is absence).
NOT_NULL = frozenset({"bits", "group_size", "factor", "partial_rotary_factor"})
# RoPE scalings that multiply the context by ``factor`` (vLLM's get_rope): without it vLLM refuses the model.
FACTOR_SCALINGS = ("linear", "dynamic", "yarn")
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")


def parse(text: str, file: Path) -> dict[str, Any]:
    """The JSON object in ``text``; PlannerInputError for nesting past MAX_DEPTH, a duplicate key, NaN or
    Infinity, anything that is not one JSON object."""
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise PlannerInputError(
            f"{file}: JSON nested {depth} levels deep; expected a model's config.json (a few levels, at most "
            f"{MAX_DEPTH}). Fix: point at the model's own config.json"
        )
    try:
        config = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_one_each)
    except json.JSONDecodeError as error:
        raise PlannerInputError(
            f"{file}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from error
    except _DuplicateKeyError as error:
        raise PlannerInputError(
            f"{file}: key {error.key!r} appears twice in one object; expected each key once (JSON readers "
            "keep only the last, so the planner and vLLM would read one of two values). Fix: remove one"
        ) from None
    except ValueError as error:  # NaN, Infinity
        raise PlannerInputError(f"{file}: {error}; expected numbers that JSON allows") from None
    if not isinstance(config, dict):
        raise PlannerInputError(f"{file}: found a JSON {type(config).__name__}; expected a JSON object")
    return config


def check(config: Mapping[str, Any], file: str = "config.json") -> None:
    """PlannerInputError naming the first value of ``config`` the planner cannot read as a model."""
    for where, section in _sections(config):
        for name in SECTIONS:
            if section.get(name) is not None and not isinstance(section[name], Mapping):
                raise PlannerInputError(
                    f"{file}: {where}{name}: found {_shown(section[name])}; expected a JSON object (or "
                    "null). Fix: the model's own config.json has it as an object of settings"
                )
        for key, value in section.items():
            if key in NUMBERS and (value is not None or key in NOT_NULL):
                _number(file, where + key, value, NUMBERS[key])
        _heads(file, where, section)
        _experts(file, where, section)
        _rope_factor(file, where, section)
        for key in ("torch_dtype", "dtype"):
            value = section.get(key)
            if value is not None and (not isinstance(value, str) or value.lower() not in DTYPE_ALIASES):
                raise PlannerInputError(
                    f"{file}: {where}{key}: found {value!r}, which is not a dtype vLLM loads weights in; "
                    "expected one of bfloat16, float16, float32. Fix: the model's own config.json names it"
                )


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _one_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKeyError(key)
        found[key] = value
    return found


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def _depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` outside strings, without recursion."""
    deepest = depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _sections(
    config: Mapping[str, Any], where: str = "", level: int = 0
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield where, config
    if level < 2:
        for name in SECTIONS:
            section = config.get(name)
            if isinstance(section, Mapping):
                yield from _sections(section, f"{where}{name}.", level + 1)


def _number(file: str, name: str, value: Any, rule: tuple[type, float, float]) -> None:
    kind, low, high = rule
    number = isinstance(value, int | float) and not isinstance(value, bool)
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if number and (kind is float or whole) and low <= value <= high:
        return
    what = "integer" if kind is int else "number"
    if kind is int and low == 1 and high == BIG:
        expected = "a positive integer"
    elif high == BIG:
        expected = f"an integer of at least {low:g}"
    else:
        expected = f"{'an' if kind is int else 'a'} {what} from {low:g} to {high:,g}"
    raise PlannerInputError(
        f"{file}: {name}: found {_shown(value)}; expected {expected}. "
        "Fix: the model's own config.json has it as a JSON number"
    )


def _shown(value: Any) -> str:
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."


def _heads(file: str, where: str, section: Mapping[str, Any]) -> None:
    heads, kv_heads = section.get("num_attention_heads"), section.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads and heads % kv_heads:
        raise PlannerInputError(
            f"{file}: {where}num_key_value_heads: found {kv_heads}, which does not divide "
            f"num_attention_heads ({heads}); expected a divisor (each KV head serves a whole group of query "
            "heads). Fix: the model's own config.json has them"
        )


def _experts(file: str, where: str, section: Mapping[str, Any]) -> None:
    experts = next((section[key] for key in EXPERTS if isinstance(section.get(key), int)), None)
    routed = section.get("num_experts_per_tok")
    if experts is None or not isinstance(routed, int):
        return
    if (experts == 0 and routed > 0) or routed > experts:
        raise PlannerInputError(
            f"{file}: {where}num_experts_per_tok: found {routed} with {experts} experts; expected a mixture "
            "of experts with experts, each token routed to at most all of them. Fix: the model's own "
            "config.json has them"
        )


def _rope_factor(file: str, where: str, section: Mapping[str, Any]) -> None:
    kind = section.get("rope_type") or section.get("type")
    if (
        where.endswith(("rope_scaling.", "rope_parameters."))
        and kind in FACTOR_SCALINGS
        and "factor" not in section
    ):
        raise PlannerInputError(
            f"{file}: {where}factor: found nothing with {kind} scaling; expected the factor it scales the "
            "context by. Fix: the model's own config.json has it"
        )
