"""Running the stages: the verbs (:mod:`~gpufleet.runner.api`), a run's options and plan
(:mod:`~gpufleet.runner.options`, :mod:`~gpufleet.runner.plan`), ansible-runner's arguments
(:mod:`~gpufleet.runner.arguments`), its events turned into per-stage results
(:mod:`~gpufleet.runner.events`), what the playbooks publish (:mod:`~gpufleet.runner.facts`), the live
progress display (:mod:`~gpufleet.runner.progress`) and the reports (:mod:`~gpufleet.runner.report`).
"""

from __future__ import annotations

from gpufleet.runner.api import deploy, rollback, status, teardown
from gpufleet.runner.events import ProgressSink
from gpufleet.runner.options import DeployError
from gpufleet.runner.plan import STAGES, deploy_specs
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
