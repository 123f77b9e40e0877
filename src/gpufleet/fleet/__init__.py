"""The fleet: its schema (pydantic, extra keys forbidden) and the inventory that fills it.

``load`` reads an inventory once with ansible-core's own loader and checks it into one frozen :class:`Fleet`
(the typed spec, every problem, the endpoint, the control host) that a run passes down; ``validate_inventory``
returns every problem; ``load_fleet`` is the same, raising :class:`~gpufleet.problems.InventoryError`.

Names are imported on first use: the playbooks' lookups import light submodules of this package (the kept
placement, :mod:`gpufleet.fleet.placement_cache`) in every Ansible worker, where the schema, the validator
and pydantic would cost a second of CPU per import.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.fleet.loaded import Endpoint, Fleet, load, load_fleet, plan_request_for_inventory
    from gpufleet.fleet.schema import FleetSpec, GpuSpec, ModelSpec, NodeSpec, ServingSpec
    from gpufleet.fleet.validate import Validation, plan_request, validate_inventory

_EXPORTS = {
    "Endpoint": "gpufleet.fleet.loaded",
    "Fleet": "gpufleet.fleet.loaded",
    "load": "gpufleet.fleet.loaded",
    "load_fleet": "gpufleet.fleet.loaded",
    "plan_request_for_inventory": "gpufleet.fleet.loaded",
    "FleetSpec": "gpufleet.fleet.schema",
    "GpuSpec": "gpufleet.fleet.schema",
    "ModelSpec": "gpufleet.fleet.schema",
    "NodeSpec": "gpufleet.fleet.schema",
    "ServingSpec": "gpufleet.fleet.schema",
    "Validation": "gpufleet.fleet.validate",
    "plan_request": "gpufleet.fleet.validate",
    "validate_inventory": "gpufleet.fleet.validate",
}

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


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
