"""Testinfra checks for preflight: what it checked holds on the hosts, and it refuses what it must."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

SCENARIO_DIR = Path(__file__).resolve().parents[1]


def converge_with(*extra: str) -> subprocess.CompletedProcess[str]:
    """Run this scenario's converge playbook again, against Molecule's inventory, with extra vars."""
    # The directory: the lab's hosts file and group_vars sit beside Molecule's own inventory file.
    inventory = str(Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent)
    return subprocess.run(
        ["ansible-playbook", "-i", inventory, str(SCENARIO_DIR / "converge.yml"), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def said(result: subprocess.CompletedProcess[str]) -> str:
    """Everything ansible printed, with its line folding undone."""
    return " ".join((result.stdout + result.stderr).split())


def test_cluster_nic_carries_the_node_ip(host: Any) -> None:
    variables = host.ansible.get_variables()
    addresses = host.interface(variables["gpufleet_nic"]).addresses
    assert variables["gpufleet_node_ip"] in addresses


# The refusal tests take no `host` fixture, so testinfra runs each once (not once per host).
def test_wrong_nic_is_refused_with_the_interfaces_found() -> None:
    result = converge_with("-e", "gpufleet_nic=ens9f1", "--limit", "node1")
    assert "node1" in result.stdout  # the limit matched the host (no "no hosts matched" success)
    assert result.returncode != 0
    assert "gpufleet_nic is ens9f1, but the host has no such interface (it has: eth0" in said(result)


def test_wrong_node_ip_is_refused() -> None:
    result = converge_with(
        "-e", "gpufleet_node_ip=10.231.99.99", "--limit", "node1", "--skip-tags", "preflight_validate"
    )
    assert result.returncode != 0
    assert "gpufleet_node_ip 10.231.99.99 is not an address of eth0" in said(result)
