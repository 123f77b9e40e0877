"""The fleet: its schema (pydantic, extra keys forbidden) and the inventory that fills it.

``validate_inventory`` reads an inventory with ansible-core's own loader and returns every problem;
``load_fleet`` is the same, raising :class:`~gpufleet.problems.InventoryError`.
"""

from __future__ import annotations

from gpufleet.fleet.schema import FleetSpec, GpuSpec, ModelSpec, NodeSpec, ServingSpec
from gpufleet.fleet.validate import (
    Validation,
    load_fleet,
    plan_request,
    plan_request_for_inventory,
    validate_inventory,
)

__all__ = [
    "FleetSpec",
    "GpuSpec",
    "ModelSpec",
    "NodeSpec",
    "ServingSpec",
    "Validation",
    "load_fleet",
    "plan_request",
    "plan_request_for_inventory",
    "validate_inventory",
]
