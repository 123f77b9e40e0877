"""Testinfra checks of the lab's wiring (prepare.yml): the unit runs on every host; hosts reach each other."""

from __future__ import annotations

from typing import Any

import pytest

PORT = 8765
HOSTS = ("node1", "node2", "node3")


def test_unit_is_enabled_and_running(host: Any) -> None:
    service = host.service("gpufleet-wiring.service")
    assert service.is_enabled
    assert service.is_running


def test_unit_listens_on_the_node_ip(host: Any) -> None:
    node_ip = host.ansible.get_variables()["gpufleet_node_ip"]
    assert host.socket(f"tcp://{node_ip}:{PORT}").is_listening


def test_groups_follow_the_lab_layout(host: Any) -> None:
    variables = host.ansible.get_variables()
    expected = "ray_head" if variables["inventory_hostname"] == "node1" else "ray_workers"
    assert {"gpu_nodes", expected} <= set(variables["group_names"])
    assert variables["gpufleet_gpu"] is False


@pytest.mark.parametrize("peer", HOSTS)
def test_reaches_every_host_by_name(host: Any, peer: str) -> None:
    page = host.check_output(f"curl --silent --fail --max-time 5 http://{peer}:{PORT}/")
    assert page.split()[0] == peer
