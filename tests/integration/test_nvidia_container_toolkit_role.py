"""nvidia_container_toolkit on a lab host without GPU: the skip and the refusals (install: Molecule scenario).

The lab can hold no real NVIDIA package (Debian ships none; nothing else may be downloaded): the bundle
holds the TEST DOUBLE .debs of tests/integration/nvidia_toolkit_double.py. What is real here: the skip on a
host without GPU, the refusal when the play did not ask the docker role for the nvidia runtime, and the
sha256 check of every package on the control node before anything reaches the host. The install with
Docker (molecule/nvidia_container_toolkit) runs from test_molecule.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import RunningLab, lab_name, skip_unless_lab_possible

from gpufleet.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(1200)]

HOST = "node1"
PREPARE = "molecule/nvidia_container_toolkit/prepare.yml"
CONVERGE = "molecule/nvidia_container_toolkit/converge.yml"
PACKAGES = (
    "libnvidia-container1 libnvidia-container-tools nvidia-container-toolkit-base nvidia-container-toolkit"
)
# Only the toolkit role: its skip and refusals come before anything that needs Docker, so these runs are
# short; the install with Docker (both roles, as playbooks/nodes.yml runs them) is the Molecule scenario's.
TOOLKIT_ONLY = ("--tags", "nvidia_container_toolkit")


@dataclass
class ToolkitLab:
    running: RunningLab
    bundle: Path

    def converge(self, *args: str, bundle: Path | None = None, **extra: object) -> tuple[int, str]:
        extra_vars = {"docker_test_bundle_dir": str(bundle or self.bundle), **extra}
        result = self.running.playbook(CONVERGE, "-e", json.dumps(extra_vars), *args)
        return result.returncode, " ".join(result.stdout.split())

    def toolkit_absent(self) -> bool:
        installed = self.running.ssh(HOST, f"dpkg-query -W {PACKAGES}").returncode == 0
        staged = (
            self.running.ssh(HOST, "test -e /var/cache/gpufleet/nvidia-container-toolkit").returncode == 0
        )
        return not installed and not staged


@pytest.fixture(scope="module")
def toolkit_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolkitLab]:
    skip_unless_lab_possible()
    bundle = tmp_path_factory.mktemp("toolkit") / "bundle"
    handle = Lab(lab_name("toolkit"), nodes=1, offline=True)
    try:
        running = RunningLab(handle, handle.up())
        prepared = running.playbook(PREPARE, "-e", json.dumps({"docker_test_bundle_dir": str(bundle)}))
        assert prepared.returncode == 0, prepared.stdout[-3000:]
        yield ToolkitLab(running, bundle)
    finally:
        handle.down()


def test_host_without_gpu_reports_and_skips_the_toolkit(toolkit_lab: ToolkitLab) -> None:
    returncode, text = toolkit_lab.converge(*TOOLKIT_ONLY, nvidia_container_toolkit_install_without_gpu=False)
    assert returncode == 0, text[-3000:]
    assert "gpufleet_gpu is false, so the NVIDIA container toolkit is skipped" in text
    assert "would install libnvidia-container1, libnvidia-container-tools" in text
    assert (
        "check that docker lists the nvidia runtime (docker_nvidia_runtime: true) and run the CUDA smoke test"
        in text
    )
    assert toolkit_lab.toolkit_absent()


def test_refuses_when_the_play_did_not_ask_docker_for_the_runtime(toolkit_lab: ToolkitLab) -> None:
    returncode, text = toolkit_lab.converge(*TOOLKIT_ONLY, docker_nvidia_runtime=False)
    assert returncode != 0, text[-3000:]
    assert "expected docker_nvidia_runtime: true" in text, text[-3000:]
    assert "set docker_nvidia_runtime: true in the group_vars" in text
    assert toolkit_lab.toolkit_absent()


def test_corrupted_package_is_refused_before_any_change(toolkit_lab: ToolkitLab, tmp_path: Path) -> None:
    corrupted = tmp_path / "bundle"
    shutil.copytree(toolkit_lab.bundle, corrupted)
    deb = next((corrupted / "nvidia_container_toolkit").glob("*/nvidia-container-toolkit-base_*.deb"))
    data = bytearray(deb.read_bytes())
    data[-10] ^= 0xFF
    deb.write_bytes(bytes(data))
    returncode, text = toolkit_lab.converge(*TOOLKIT_ONLY, bundle=corrupted)
    assert returncode != 0, text[-3000:]
    assert f"expected {deb} with sha256" in text, text[-3000:]
    assert "Nothing was changed on the host" in text
    assert toolkit_lab.toolkit_absent()
