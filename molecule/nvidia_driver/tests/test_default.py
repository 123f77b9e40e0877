"""Molecule verify (testinfra) for nvidia_driver: node1 untouched (lab mode), node2 via the double."""

from __future__ import annotations

DOUBLE = "/var/lib/gpufleet-test-double/nvidia-driver"
EXPECTED_ARGS = "--silent --accept-license --no-questions --ui=none --disable-nouveau --no-x-check --dkms"


def test_lab_host_is_left_alone(host):
    if host.backend.get_hostname() != "node1":
        return
    for path in (
        "/var/lib/gpufleet/nvidia_driver.state",
        "/etc/modprobe.d/gpufleet-blacklist-nouveau.conf",
        "/etc/systemd/system/nvidia-persistenced.service",
        "/var/cache/gpufleet/nvidia_driver",
        f"{DOUBLE}/calls.log",
    ):
        assert not host.file(path).exists, f"{path} was written on a host with gpufleet_gpu: false"


def test_double_host_ran_the_installer_once_with_the_silent_dkms_arguments(host):
    if host.backend.get_hostname() != "node2":
        return
    calls = host.file(f"{DOUBLE}/calls.log").content_string.splitlines()
    assert calls == [EXPECTED_ARGS]


def test_double_host_records_the_installed_version(host):
    if host.backend.get_hostname() != "node2":
        return
    state = host.file("/var/lib/gpufleet/nvidia_driver.state")
    assert 'version: "550.163.01"' in state.content_string
    assert state.mode == 0o644


def test_double_host_blacklists_nouveau(host):
    if host.backend.get_hostname() != "node2":
        return
    blacklist = host.file("/etc/modprobe.d/gpufleet-blacklist-nouveau.conf")
    assert "blacklist nouveau" in blacklist.content_string
    assert "options nouveau modeset=0" in blacklist.content_string


def test_double_host_runs_persistence_mode(host):
    if host.backend.get_hostname() != "node2":
        return
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    assert service.is_running
