"""Every role's Molecule scenario passes on the lab (as test_molecule.py says): the NVIDIA driver and the
roles that bring the artifacts (images, the model), and monitoring."""

from __future__ import annotations

import pytest
from molecule_support import scenario_passes

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SCENARIOS = [
    "nvidia_driver",
    "image_distribution",
    "model_fetch",
    # Prometheus, node_exporter and the Grafana/dcgm paths on 2 hosts (about 110 s under CI load); the lab
    # end-to-end test deploys the same role with the whole service: `make test-all`.
    pytest.param("monitoring", marks=pytest.mark.heavy),
]


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_passes(scenario: str) -> None:
    scenario_passes(scenario)
