"""Shared by the two test modules: the test double's directory and which scenario host each module checks."""

from __future__ import annotations

import os
from pathlib import Path

import testinfra.utils.ansible_runner

DOUBLE = "/var/lib/gpufleet-test-double/nvidia-driver"
# The directory, as the verifier's --ansible-inventory: the lab's hosts file (groups, gpufleet_* variables)
# sits beside Molecule's own inventory file, which knows the hosts but not the lab's groups.
INVENTORY = str(Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent)


def scenario_host(name: str) -> list[str]:
    """testinfra_hosts for one host of this scenario; fails, instead of collecting nothing, without it."""
    hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts(name)
    assert hosts == [name], f"Molecule's inventory has no host {name} (found {hosts}): see molecule.yml"
    return hosts
