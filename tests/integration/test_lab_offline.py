"""An offline lab (the session lab is one) reaches its own hosts and this machine's bridge address only.

Nothing here can leave the machine: hosts have no default route, and the bridge drops what they route
past it. Every probe uses a short timeout and must fail fast or be dropped.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from conftest import RunningLab

from gpufleet.lab.system import run

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

REGISTRY = "registry-1.docker.io"
# An address from TEST-NET-2 (RFC 5737) stands for "anywhere outside": even a broken lab could not
# send anyone traffic with it.
OUTSIDE = "198.51.100.7"


def test_registry_name_does_not_resolve(lab: RunningLab) -> None:
    started = time.monotonic()
    result = lab.ssh("node1", f"curl --silent --show-error --max-time 5 https://{REGISTRY}/v2/")
    assert result.returncode == 6, result.stderr  # curl: could not resolve host
    assert time.monotonic() - started < 4


def test_outside_address_is_unreachable(lab: RunningLab) -> None:
    started = time.monotonic()
    result = lab.ssh("node2", f"curl --silent --show-error --max-time 5 http://{OUTSIDE}/")
    assert result.returncode == 7, result.stderr  # curl: could not connect (no route)
    assert time.monotonic() - started < 4


def test_a_route_added_on_a_host_is_still_dropped_at_the_bridge(lab: RunningLab) -> None:
    bridge = lab.inventory.bridge_ip
    assert lab.ssh("node3", f"ip route add default via {bridge}").returncode == 0
    try:
        result = lab.ssh("node3", f"curl --silent --show-error --max-time 2 http://{OUTSIDE}/")
        assert result.returncode == 28, result.stderr  # curl: timed out, the bridge dropped it
        for address in control_node_addresses_outside_the_lab():
            result = lab.ssh("node3", f"curl --silent --show-error --max-time 2 http://{address}:22/")
            assert result.returncode == 28, (address, result.stderr)  # dropped, not refused
    finally:
        lab.ssh("node3", f"ip route del default via {bridge}")


def control_node_addresses_outside_the_lab() -> list[str]:
    addresses = json.loads(run(["ip", "-j", "-4", "addr", "show", "scope", "global"]).stdout)
    found = [info["local"] for link in addresses for info in link.get("addr_info", [])]
    return [address for address in found if not address.startswith("10.231.")]


def test_hosts_reach_this_machine_on_the_bridge_address(lab: RunningLab) -> None:
    with socket.create_server((lab.inventory.bridge_ip, 0)) as server:
        port = server.getsockname()[1]
        accepted = threading.Thread(target=lambda: server.accept()[0].sendall(b"control-node\n"), daemon=True)
        accepted.start()
        connect = f"exec 3<>/dev/tcp/{lab.inventory.bridge_ip}/{port}; head -1 <&3"
        result = lab.ssh("node1", f"timeout 5 bash -c '{connect}'")
        accepted.join(timeout=5)
    assert result.stdout.strip() == "control-node", result.stderr


def test_hosts_reach_each_other(lab: RunningLab) -> None:
    result = lab.ssh("node1", "timeout 5 bash -c 'exec 3<>/dev/tcp/node3/22; head -c 7 <&3'")
    assert result.stdout == "SSH-2.0"
