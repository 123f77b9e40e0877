"""Molecule verify (testinfra) for nvidia_driver on node2, whose driver installer is the TEST DOUBLE."""

from __future__ import annotations

from conftest import DOUBLE, scenario_host

EXPECTED_ARGS = "--silent --accept-license --no-questions --ui=none --disable-nouveau --no-x-check --dkms"

testinfra_hosts = scenario_host("node2")


def test_double_host_ran_the_installer_once_with_the_silent_dkms_arguments(host) -> None:
    calls = host.file(f"{DOUBLE}/calls.log").content_string.splitlines()
    assert calls == [EXPECTED_ARGS]


def test_double_host_records_the_installed_version(host) -> None:
    state = host.file("/var/lib/gpufleet/nvidia_driver.state")
    assert 'version: "550.163.01"' in state.content_string
    assert state.mode == 0o644


def test_double_host_blacklists_nouveau(host) -> None:
    blacklist = host.file("/etc/modprobe.d/gpufleet-blacklist-nouveau.conf")
    assert "blacklist nouveau" in blacklist.content_string
    assert "options nouveau modeset=0" in blacklist.content_string


def test_double_host_runs_persistence_mode(host) -> None:
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    assert service.is_running


def test_persistence_unit_passed_systemd_analyze_verify(host) -> None:
    """The unit was written through validate: (systemd-analyze verify); it verifies on the host as written."""
    unit = "/etc/systemd/system/nvidia-persistenced.service"
    assert host.run(f"systemd-analyze verify {unit}").rc == 0
