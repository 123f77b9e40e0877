"""Testinfra checks for the docker scenario: static binaries, units, daemon.json, a live daemon that
loads an image archive and runs a container without any registry.

The nvidia_container_toolkit scenario runs them too (its molecule.yml: verifier additional_files_or_dirs), on
a host whose docker role also registered the nvidia runtime as the default; that scenario's own checks assert
the runtime's keys, these the rest."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpufleet.bundle import read_lock

BINARIES = (
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "docker",
    "docker-init",
    "docker-proxy",
    "dockerd",
    "runc",
)
IMAGE_ARCHIVE = "/root/gpufleet-test-busybox.tar"
IMAGE = "gpufleet-test/busybox:1"
# In the nvidia_container_toolkit scenario, the docker role was asked for the nvidia runtime (as the default).
NVIDIA_RUNTIME = os.environ.get("MOLECULE_SCENARIO_NAME") == "nvidia_container_toolkit"
RUNTIME_KEYS = {"runtimes", "default-runtime"}


def expected_version() -> str:
    """The version converge installed: the first Docker tarball of the test bundle that prepare wrote."""
    lock = read_lock(Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "bundle")
    return next(entry.version for entry in lock.files if entry.path.startswith("docker/"))


def docker_info(host: Any) -> dict[str, Any]:
    return json.loads(host.check_output("docker info --format '{{json .}}'"))


@pytest.mark.parametrize("name", BINARIES)
def test_binary_is_installed(host: Any, name: str) -> None:
    binary = host.file(f"/usr/local/bin/{name}")
    assert binary.is_file
    assert binary.user == "root"
    assert binary.mode == 0o755


@pytest.mark.parametrize("unit", ["containerd.service", "docker.service"])
def test_unit_is_enabled_and_running(host: Any, unit: str) -> None:
    service = host.service(unit)
    assert service.is_enabled
    assert service.is_running


@pytest.mark.parametrize("unit", ["containerd.service", "docker.service"])
def test_unit_keeps_containers_alive(host: Any, unit: str) -> None:
    shown = host.check_output(f"systemctl show {unit} -p Type -p Delegate -p KillMode -p Restart")
    assert set(shown.splitlines()) == {"Type=notify", "Delegate=yes", "KillMode=process", "Restart=always"}


def test_docker_starts_after_containerd_and_the_network(host: Any) -> None:
    after = host.check_output("systemctl show docker.service -p After")
    assert "containerd.service" in after
    assert "network-online.target" in after


def test_daemon_json_holds_the_scenario_settings(host: Any) -> None:
    config = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert RUNTIME_KEYS & config.keys() == (RUNTIME_KEYS if NVIDIA_RUNTIME else set()), config
    assert {key: value for key, value in config.items() if key not in RUNTIME_KEYS} == {
        "bip": "172.31.255.1/24",
        "data-root": "/var/lib/docker",
        "default-address-pools": [{"base": "172.30.0.0/16", "size": 24}],
        "log-driver": "json-file",
        "log-opts": {"max-file": "3", "max-size": "10m"},
        "storage-driver": "overlay2",
    }


def test_docker_reports_the_installed_version(host: Any) -> None:
    assert docker_info(host)["ServerVersion"].split("+")[0] == expected_version()


def test_docker_uses_overlay2_and_runc(host: Any) -> None:
    info = docker_info(host)
    assert info["Driver"] == "overlay2"
    assert info["DefaultRuntime"] == ("nvidia" if NVIDIA_RUNTIME else "runc")


def test_docker_bridge_uses_the_configured_address(host: Any) -> None:
    assert "172.31.255.1/24" in host.check_output("ip -4 addr show docker0")


def test_loaded_image_runs_without_a_registry(host: Any) -> None:
    host.check_output(f"docker load --input {IMAGE_ARCHIVE}")
    out = host.check_output(f"docker run --rm --pull never {IMAGE} sh -c 'echo ran on; hostname'")
    assert out.splitlines()[0] == "ran on"


# docker-proxy accepts before the container listens, so an empty reply means "not yet": try again.
READ_PUBLISHED_PORT = """
import socket, time
for _ in range(50):
    try:
        reply = socket.create_connection(("127.0.0.1", 18080), timeout=5).recv(100).decode()
    except OSError:
        reply = ""
    if reply:
        break
    time.sleep(0.1)
print(reply)
"""


def test_published_port_goes_through_docker_proxy(host: Any) -> None:
    host.check_output(f"docker load --input {IMAGE_ARCHIVE}")
    host.check_output(
        f"docker run --detach --rm --pull never --publish 127.0.0.1:18080:8080 {IMAGE}"
        " busybox nc -l -p 8080 -e echo through-the-proxy"
    )
    assert host.check_output(f"python3 -c '{READ_PUBLISHED_PORT}'").strip() == "through-the-proxy"
