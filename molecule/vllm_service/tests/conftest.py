"""Which lab hosts each test module checks (testinfra_hosts), from the scenario's inventory."""

from __future__ import annotations

import os
from pathlib import Path

import testinfra.utils.ansible_runner

# The directory, as the verifier's --ansible-inventory: the lab's hosts file (groups, gpufleet_* variables)
# sits beside Molecule's own inventory file, which knows the hosts but not the lab's groups.
INVENTORY = str(Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent)


def group_hosts(group: str, count: int) -> list[str]:
    """testinfra_hosts for a lab group; fails, instead of collecting nothing, when it is not as expected."""
    hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts(group)
    assert len(hosts) == count, f"expected {count} host(s) in group {group} of {INVENTORY}; found {hosts}"
    return hosts
