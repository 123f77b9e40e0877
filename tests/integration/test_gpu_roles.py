"""The nvidia_driver and cuda_toolkit roles on lab hosts.

- Their Molecule scenarios (molecule/nvidia_driver: lab mode + the .run installer TEST DOUBLE;
  molecule/cuda_toolkit: Debian trixie's real nvidia-cuda-toolkit 12.4.131 from an offline repository, on a
  host whose network is cut off) run from test_molecule.py.
- nvidia_driver behaviours that need a fresh host each: the no-GPU failure, lab mode, check mode on a fresh
  and a converged host, mismatch handling, a pending reboot, a wrong sha256. The GPU-only paths use the
  TEST DOUBLE (tests/doubles/nvidia-installer-double.sh); the real driver path is run on the GPU machine
  (roles/nvidia_driver/README.md, Testing).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import RunningLab, lab_name, skip_unless_lab_possible
from gpu_roles_support import driver_bundle

from gpufleet.lab import Lab

# Each test boots its own trixie host and runs the driver role (about 2 minutes each); the nvidia_driver
# Molecule scenario (test_molecule.py, in `make test`) covers lab mode and the installer double, these
# finer paths run in `make test-all`.
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.heavy]

PLAY = "tests/integration/gpu_driver_play.yml"
DOUBLE = "/var/lib/gpufleet-test-double"
PIN = "550.163.01"
OTHER = "570.133.20"
SILENT_DKMS_ARGS = "--silent --accept-license --no-questions --ui=none --disable-nouveau --no-x-check --dkms"
RECAP = re.compile(r"node1\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


def double_vars(bundle: Path, version: str = PIN, **extra: object) -> dict[str, object]:
    """Role inputs that point the role at the double (only tests do this) for a host with a fake GPU."""
    return {
        "gpufleet_gpu": True,
        "gpufleet_bundle_dir": str(bundle),
        "nvidia_driver_version": version,
        "nvidia_driver_branch": version.split(".", maxsplit=1)[0],
        "nvidia_driver_kernel_headers": False,  # the lab runs the machine's kernel: no headers package exists
        "nvidia_driver_build_packages": [],  # offline hosts; the double builds nothing
        "nvidia_driver_detect_version_file": f"{DOUBLE}/nvidia-driver/proc-version",
        "nvidia_driver_detect_smi_command": f"{DOUBLE}/nvidia-driver/bin/nvidia-smi",
        "nvidia_driver_detect_pci_dir": f"{DOUBLE}/fake-pci",
        "nvidia_driver_persistenced_path": f"{DOUBLE}/nvidia-driver/bin/nvidia-persistenced",
        **extra,
    }


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    match = RECAP.search(result.stdout)
    assert match, result.stdout[-4000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups()), strict=True))


class DriverHost:
    """node1 of this module's lab, with the role applied through ansible-playbook and extra vars."""

    def __init__(self, running: RunningLab, work: Path) -> None:
        self.running = running
        self.work = work

    def play(self, variables: dict[str, object], *args: str) -> subprocess.CompletedProcess[str]:
        extra = self.work / "vars.json"
        extra.write_text(json.dumps(variables))
        return self.running.playbook(PLAY, "-e", f"@{extra}", *args)

    def calls(self) -> list[str]:
        result = self.running.ssh("node1", f"cat {DOUBLE}/nvidia-driver/calls.log")
        return result.stdout.splitlines() if result.returncode == 0 else []

    def exists(self, path: str) -> bool:
        return self.running.ssh("node1", f"test -e {path}").returncode == 0


@pytest.fixture(scope="module")
def driver_lab() -> Iterator[RunningLab]:
    """One offline trixie host for this module; each test resets it to a fresh host."""
    skip_unless_lab_possible()
    handle = Lab(lab_name("gpuroles"), nodes=1, suite="trixie", offline=True)
    try:
        yield RunningLab(handle, handle.up())
    finally:
        handle.down()


@pytest.fixture
def host(driver_lab: RunningLab, tmp_path: Path) -> DriverHost:
    """A fresh host with a fake sysfs GPU (class 0302) that only the double's variables point at."""
    driver_lab.lab.reset()
    device = f"{DOUBLE}/fake-pci/0000:01:00.0"
    made = driver_lab.ssh(
        "node1", f"mkdir -p {device} && echo 0x10de >{device}/vendor && echo 0x030200 >{device}/class"
    )
    assert made.returncode == 0, made.stdout
    return DriverHost(driver_lab, tmp_path)


@pytest.fixture
def bundles(tmp_path: Path) -> dict[str, Path]:
    return {version: driver_bundle(tmp_path / f"bundle-{version}", version) for version in (PIN, OTHER)}


def test_host_without_gpu_fails_clearly(host: DriverHost) -> None:
    result = host.play({"gpufleet_gpu": True})
    assert result.returncode != 0
    assert "node1: expected an NVIDIA GPU (PCI vendor 10de, class 03xx" in " ".join(result.stdout.split())
    assert not host.exists("/var/cache/gpufleet/nvidia_driver")


def test_lab_mode_reports_skips_and_predicts_the_cuda_version(host: DriverHost) -> None:
    checked = host.play({}, "--check")
    applied = host.play({})
    assert recap(checked)["changed"] == 0 and recap(checked)["failed"] == 0, checked.stdout[-4000:]
    assert recap(applied)["changed"] == 0 and recap(applied)["failed"] == 0, applied.stdout[-4000:]
    text = " ".join(applied.stdout.split())
    assert "gpufleet_gpu is false on node1: install, configure and verify are skipped." in text
    assert "nvidia_driver_cuda_version 13.0 (predicted from nvidia_driver_branch 580" in text
    assert not host.exists("/etc/modprobe.d/gpufleet-blacklist-nouveau.conf")


def test_double_install_is_check_safe_and_idempotent(host: DriverHost, bundles: dict[str, Path]) -> None:
    variables = double_vars(bundles[PIN])
    fresh_check = host.play(variables, "--check")
    assert recap(fresh_check)["failed"] == 0, fresh_check.stdout[-4000:]
    assert host.calls() == [] and not host.exists("/var/lib/gpufleet/nvidia_driver.state")

    first = host.play(variables)
    assert recap(first)["failed"] == 0 and recap(first)["changed"] > 0, first.stdout[-4000:]
    assert host.calls() == [SILENT_DKMS_ARGS]
    assert "NVIDIA driver 550.163.01; supports CUDA up to 12.4 (nvidia-smi)" in " ".join(first.stdout.split())

    second = host.play(variables)
    converged_check = host.play(variables, "--check")
    assert recap(second)["changed"] == 0, second.stdout[-4000:]
    assert recap(converged_check)["changed"] == 0, converged_check.stdout[-4000:]
    assert host.calls() == [SILENT_DKMS_ARGS]


def test_installer_gets_the_kernel_module_type_and_extra_options(
    host: DriverHost, bundles: dict[str, Path]
) -> None:
    variables = double_vars(
        bundles[PIN],
        nvidia_driver_runfile_kernel_module_type="open",
        nvidia_driver_runfile_extra_args=["--no-cc-version-check"],
    )
    result = host.play(variables)
    assert recap(result)["failed"] == 0, result.stdout[-4000:]
    assert host.calls() == [f"{SILENT_DKMS_ARGS} --kernel-module-type=open --no-cc-version-check"]


def test_mismatch_stops_when_changes_are_not_allowed(host: DriverHost, bundles: dict[str, Path]) -> None:
    assert recap(host.play(double_vars(bundles[PIN])))["failed"] == 0
    result = host.play(double_vars(bundles[OTHER], OTHER, nvidia_driver_allow_change=False))
    text = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert (
        f"node1: expected NVIDIA driver {OTHER}; found {PIN} loaded. nvidia_driver_allow_change is false"
        in text
    )
    assert host.calls() == [SILENT_DKMS_ARGS]


def test_mismatch_is_explained_and_replaced_when_allowed(host: DriverHost, bundles: dict[str, Path]) -> None:
    assert recap(host.play(double_vars(bundles[PIN])))["failed"] == 0
    result = host.play(double_vars(bundles[OTHER], OTHER))
    text = " ".join(result.stdout.split())
    assert recap(result)["failed"] == 0, result.stdout[-4000:]
    assert f"action: change (driver {PIN} is loaded; the role will install {OTHER} over it" in text
    assert host.calls() == [SILENT_DKMS_ARGS, SILENT_DKMS_ARGS]
    state = host.running.ssh("node1", "cat /var/lib/gpufleet/nvidia_driver.state").stdout
    assert yaml.safe_load(state)["version"] == OTHER


def test_pending_reboot_stops_with_its_reason(host: DriverHost, bundles: dict[str, Path]) -> None:
    assert recap(host.play(double_vars(bundles[PIN])))["failed"] == 0
    # As after an install whose module the kernel has not loaded: no module version, no answering nvidia-smi.
    host.running.ssh("node1", f"rm {DOUBLE}/nvidia-driver/proc-version {DOUBLE}/nvidia-driver/bin/nvidia-smi")
    result = host.play(double_vars(bundles[PIN]))
    text = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert f"node1: reboot pending: driver {PIN} was installed by gpufleet" in text
    assert "set nvidia_driver_reboot: true to let the role reboot it" in text
    assert host.calls() == [SILENT_DKMS_ARGS]


def test_wrong_sha256_stops_before_anything_is_copied(host: DriverHost, bundles: dict[str, Path]) -> None:
    lock_path = bundles[PIN] / "bundle.lock.yml"
    lock = yaml.safe_load(lock_path.read_text())
    lock["files"][0]["sha256"] = "0" * 64
    lock_path.write_text(yaml.safe_dump(lock))
    result = host.play(double_vars(bundles[PIN]))
    assert result.returncode != 0
    assert "Nothing was copied" in " ".join(result.stdout.split())
    assert not host.exists(f"/var/cache/gpufleet/nvidia_driver/NVIDIA-Linux-x86_64-{PIN}.run")
    assert host.calls() == []
