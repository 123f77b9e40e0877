"""Every role's Molecule scenario passes on the lab: (prepare,) check, converge, idempotence (changed=0),
testinfra verify, destroy — and leaves no lab behind. The serving scenarios, which need the CPU serving
image built first, run from test_serving.py with the same helper."""

from __future__ import annotations

import os

import pytest
from conftest import run_molecule

from gpufleet.runner.arguments import strategy_env

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SCENARIOS = [
    "preflight",
    "docker",
    "nvidia_container_toolkit",
    "nvidia_driver",
    # 1.9 GB of Debian's CUDA 12.4 packages installed from an offline repository: `make test-all`.
    pytest.param("cuda_toolkit", marks=pytest.mark.heavy),
    "image_distribution",
    "model_fetch",
    # Prometheus, node_exporter and the Grafana/dcgm paths on 2 hosts (about 110 s under CI load); the lab
    # end-to-end test deploys the same role with the whole service: `make test-all`.
    pytest.param("monitoring", marks=pytest.mark.heavy),
]


# The suite runs Ansible under the runner's strategy (mitogen_linear, conftest.ansible_env), as `gpufleet
# deploy` does; `ansible-playbook site.yml` runs under Ansible's own, which this scenario keeps covered
# (preflight: the action plugin, the validation and become, in every site.yml run).
ANSIBLE_OWN_STRATEGY = {"preflight"}


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_passes(scenario: str) -> None:
    linear = {"ANSIBLE_STRATEGY": "linear"} if scenario in ANSIBLE_OWN_STRATEGY else None
    out = run_molecule(scenario, extra_env=linear, timeout=2300)
    # ansible-core warns of every strategy plugin not its own (mitogen's): the strategy was the one meant
    # (GPUFLEET_ANSIBLE_STRATEGY=linear runs every scenario under Ansible's own).
    meant = "linear" if linear else strategy_env(os.environ)["ANSIBLE_STRATEGY"]
    third_party = "strategy plugins not included in ansible.builtin" in out
    assert third_party == meant.startswith("mitogen"), f"{scenario}: ran under another strategy than {meant}"
