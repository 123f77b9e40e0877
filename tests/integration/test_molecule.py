"""Every role's Molecule scenario passes on the lab: (prepare,) check, converge, idempotence (changed=0),
testinfra verify, destroy — and leaves no lab behind. This file: the node's container stack; the driver
and the artifact roles are in test_molecule_driver_artifacts.py (molecule_support.py says why two files).
The serving scenarios, which need the CPU serving image built first, run from test_serving.py."""

from __future__ import annotations

import pytest
from molecule_support import scenario_passes

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SCENARIOS = [
    "preflight",
    # heavy (issue 33): the nvidia_container_toolkit scenario converges the docker role too (as nodes.yml
    # does) with this scenario's settings, check and idempotence, and runs this scenario's testinfra checks;
    # what differs here is two hosts and daemon.json without the nvidia runtime (the lab end-to-end deploys
    # that).
    pytest.param("docker", marks=pytest.mark.heavy),
    "nvidia_container_toolkit",
    # 1.9 GB of Debian's CUDA 12.4 packages installed from an offline repository: `make test-all`.
    pytest.param("cuda_toolkit", marks=pytest.mark.heavy),
]


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_passes(scenario: str) -> None:
    scenario_passes(scenario)
