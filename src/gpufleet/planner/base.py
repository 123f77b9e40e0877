"""What every planner module shares: the errors, one parameter of a layer, and config.json's integers.

Kept apart from :mod:`gpufleet.planner.arch` so that the modules it builds on (:mod:`gpufleet.planner.hybrid`)
can use them without an import cycle; ``arch`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class PlannerInputError(ValueError):
    """Input the planner cannot work with: an unreadable config.json, an unknown dtype or quantization."""


class PlannerUnmodelledError(PlannerInputError):
    """A valid model the planner does not model (a vision tower, DeepSeek-V4, a quantization method it lacks):
    validation warns and goes on; any other PlannerInputError is a wrong input and is refused."""


@dataclass(frozen=True)
class Param:
    """One parameter of a decoder layer on one rank; ``in_features == 0`` marks a vector (bias, norm)."""

    name: str
    out_features: int
    in_features: int = 0
    shards: int = 1  # logical shards fused into one parameter (q/k/v, gate/up): one fp8 scale each
    copies: int = 1  # fused MoE experts: one (out x in) matrix per local expert
    quantizable: bool = True  # routers, gates and norms are never quantized
    dtype_bytes: int = 0  # fixed element size (float32 sinks or score biases); 0 = the model dtype

    @property
    def is_linear(self) -> bool:
        return self.in_features > 0


def config_int(config: Mapping[str, Any], key: str) -> int:
    """A required positive integer of config.json."""
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlannerInputError(
            f"config.json: {key}: found {value!r}; expected a positive integer. "
            "Fix: point the planner at the model's own config.json (a decoder-only transformer)"
        )
    return value


def config_opt_int(config: Mapping[str, Any], *keys: str) -> int:
    """The first of ``keys`` that holds a positive integer, or 0."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0
