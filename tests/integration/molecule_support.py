"""What every Molecule scenario of the suite must do (test_molecule.py, test_molecule_driver_artifacts.py).

Two files because each file goes whole to one worker: smaller files let the two workers end closer together.
"""

from __future__ import annotations

import os

from conftest import run_molecule

from gpufleet.runner.arguments import strategy_env

# The suite runs Ansible under the runner's strategy (mitogen_linear, conftest.ansible_env), as `gpufleet
# deploy` does; `ansible-playbook site.yml` runs under Ansible's own, which this scenario keeps covered
# (preflight: the action plugin, the validation and become, in every site.yml run).
ANSIBLE_OWN_STRATEGY = {"preflight"}


def scenario_passes(scenario: str) -> None:
    """(prepare,) check, converge, idempotence (changed=0), verify, destroy: under the strategy meant."""
    linear = {"ANSIBLE_STRATEGY": "linear"} if scenario in ANSIBLE_OWN_STRATEGY else None
    out = run_molecule(scenario, extra_env=linear, timeout=2300)
    # ansible-core warns of every strategy plugin not its own (mitogen's): the strategy was the one meant
    # (GPUFLEET_ANSIBLE_STRATEGY=linear runs every scenario under Ansible's own).
    meant = "linear" if linear else strategy_env(os.environ)["ANSIBLE_STRATEGY"]
    third_party = "strategy plugins not included in ansible.builtin" in out
    assert third_party == meant.startswith("mitogen"), f"{scenario}: ran under another strategy than {meant}"
