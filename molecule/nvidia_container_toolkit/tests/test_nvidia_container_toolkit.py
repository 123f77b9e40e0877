"""Testinfra checks for the nvidia_container_toolkit scenario (TEST DOUBLE packages, real Docker)."""

from __future__ import annotations

import json
from typing import Any

import pytest

PACKAGES = (
    "libnvidia-container1",
    "libnvidia-container-tools",
    "nvidia-container-toolkit-base",
    "nvidia-container-toolkit",
)


@pytest.mark.parametrize("name", PACKAGES)
def test_package_is_installed_at_the_pinned_version(host: Any, name: str) -> None:
    package = host.package(name)
    assert package.is_installed
    assert package.version == "1.17.4-1"


def test_installed_packages_are_the_test_doubles(host: Any) -> None:
    # Guards against reading this scenario as proof that NVIDIA's real packages were installed.
    description = host.check_output("dpkg-query -W -f '${Description}' nvidia-container-toolkit")
    assert description.startswith("TEST DOUBLE")


def test_nvidia_ctk_reports_the_version(host: Any) -> None:
    assert "version 1.17.4" in host.check_output("nvidia-ctk --version")


def test_daemon_json_registers_the_nvidia_runtime(host: Any) -> None:
    config = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert config["runtimes"] == {"nvidia": {"path": "/usr/bin/nvidia-container-runtime", "runtimeArgs": []}}
    assert config["default-runtime"] == "nvidia"


def test_docker_lists_nvidia_as_the_default_runtime(host: Any) -> None:
    info = json.loads(host.check_output("docker info --format '{{json .}}'"))
    assert "nvidia" in info["Runtimes"]
    assert info["DefaultRuntime"] == "nvidia"


def test_container_runs_through_the_nvidia_runtime(host: Any) -> None:
    host.check_output("docker load --input /root/gpufleet-test-busybox.tar")
    out = host.check_output(
        "docker run --rm --pull never --runtime nvidia gpufleet-test/busybox:1 echo via-nvidia"
    )
    assert out.strip() == "via-nvidia"
