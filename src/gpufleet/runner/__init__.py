"""Running the stages: ansible-runner's arguments (:mod:`~gpufleet.runner.arguments`), its events turned
into per-stage results (:mod:`~gpufleet.runner.events`), the live progress display
(:mod:`~gpufleet.runner.progress`) and the reports (:mod:`~gpufleet.runner.report`).
"""

from __future__ import annotations

from gpufleet.runner.core import (
    STAGES,
    DeployError,
    ProgressSink,
    deploy,
    deploy_specs,
    rollback,
    status,
    teardown,
)
from gpufleet.runner.report import DeployReport, StatusReport

__all__ = [
    "STAGES",
    "DeployError",
    "DeployReport",
    "ProgressSink",
    "StatusReport",
    "deploy",
    "deploy_specs",
    "rollback",
    "status",
    "teardown",
]
