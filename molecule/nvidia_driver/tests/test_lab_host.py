"""Molecule verify (testinfra) for nvidia_driver on node1, a lab host like every other (gpufleet_gpu: false):
detection runs, every GPU-only step reports and skips, nothing is written."""

from __future__ import annotations

import pytest
from conftest import DOUBLE, scenario_host

testinfra_hosts = scenario_host("node1")


@pytest.mark.parametrize(
    "path",
    [
        "/var/lib/gpufleet/nvidia_driver.state",
        "/etc/modprobe.d/gpufleet-blacklist-nouveau.conf",
        "/etc/systemd/system/nvidia-persistenced.service",
        "/var/cache/gpufleet/nvidia_driver",
        f"{DOUBLE}/calls.log",
    ],
)
def test_lab_host_is_left_alone(host, path: str) -> None:
    assert not host.file(path).exists, f"{path} was written on a host with gpufleet_gpu: false"
