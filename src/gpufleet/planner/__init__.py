"""The vLLM memory planner: what vLLM will do at start-up, and what it will refuse, before deploying.

:mod:`~gpufleet.planner.arch` reads a model's config, :mod:`~gpufleet.planner.weights` sizes its weights
per rank, :mod:`~gpufleet.planner.estimates` holds the figures vLLM only measures at run time,
:mod:`~gpufleet.planner.checks` what vLLM would refuse, :mod:`~gpufleet.planner.core` puts them together
and :mod:`~gpufleet.planner.report` shows a plan (rich; imported only where something is shown).
"""

from __future__ import annotations

from gpufleet.planner.base import PlannerInputError, PlannerUnmodelledError
from gpufleet.planner.core import load_model_config, plan
from gpufleet.planner.model import GpuDevice, KvCapacity, Plan, PlanRequest, StagePlan, kv_cache_capacity

__all__ = [
    "GpuDevice",
    "KvCapacity",
    "Plan",
    "PlanRequest",
    "PlannerInputError",
    "PlannerUnmodelledError",
    "StagePlan",
    "kv_cache_capacity",
    "load_model_config",
    "plan",
]
