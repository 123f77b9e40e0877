"""The fleet: its schema (pydantic, extra keys forbidden) and the inventory that fills it.

``load`` reads an inventory once with ansible-core's own loader and checks it into one frozen :class:`Fleet`
(the typed spec, every problem, the P/D pools, the endpoint) that a run passes down; ``validate_inventory``
returns every problem; ``load_fleet`` is the same, raising :class:`~gpufleet.problems.InventoryError`.
"""

from __future__ import annotations

from gpufleet.fleet.loaded import Endpoint, Fleet, load, load_fleet, plan_request_for_inventory
from gpufleet.fleet.schema import FleetSpec, GpuSpec, ModelSpec, NodeSpec, ServingSpec
from gpufleet.fleet.validate import Validation, plan_request, validate_inventory

__all__ = [
    "Endpoint",
    "Fleet",
    "FleetSpec",
    "GpuSpec",
    "ModelSpec",
    "NodeSpec",
    "ServingSpec",
    "Validation",
    "load",
    "load_fleet",
    "plan_request",
    "plan_request_for_inventory",
    "validate_inventory",
]
