"""gpufleet: bare GPU servers to a verified multi-node vLLM service, online or air-gapped.

The public API::

    from gpufleet import deploy, load_fleet, plan, PlanRequest
    report = deploy(Path("inventories/prod"), bundle=Path("/srv/bundle"))

Names are imported on first use, so that ``gpufleet validate`` does not pay for ansible-runner.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from gpufleet._version import __version__

_EXPORTS = {
    "deploy": "gpufleet.runner",
    "status": "gpufleet.runner",
    "teardown": "gpufleet.runner",
    "DeployError": "gpufleet.runner",
    "DeployReport": "gpufleet.runner",
    "StatusReport": "gpufleet.runner",
    "FleetSpec": "gpufleet.fleet",
    "load_fleet": "gpufleet.fleet",
    "InventoryError": "gpufleet.problems",
    "Problem": "gpufleet.problems",
    "validate_inventory": "gpufleet.fleet",
    "plan": "gpufleet.planner",
    "Plan": "gpufleet.planner",
    "PlanRequest": "gpufleet.planner",
    "GpuDevice": "gpufleet.planner",
}

__all__ = [
    "DeployError",
    "DeployReport",
    "FleetSpec",
    "GpuDevice",
    "InventoryError",
    "Plan",
    "PlanRequest",
    "Problem",
    "StatusReport",
    "__version__",
    "deploy",
    "load_fleet",
    "plan",
    "status",
    "teardown",
    "validate_inventory",
]

if TYPE_CHECKING:
    from gpufleet.fleet import FleetSpec, load_fleet, validate_inventory
    from gpufleet.planner import GpuDevice, Plan, PlanRequest, plan
    from gpufleet.problems import InventoryError, Problem
    from gpufleet.runner import DeployError, DeployReport, StatusReport, deploy, status, teardown


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gpufleet' has no attribute {name!r}")
