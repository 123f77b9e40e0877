"""The Ray cluster as each node sees it: units, each container's own address and NIC, the image, the model.
Ray's own view of the cluster is read on the head (test_ray_head.py)."""

from __future__ import annotations

import json

from conftest import group_hosts

testinfra_hosts = group_hosts("gpu_nodes", 3)

DOCKER = "/usr/local/bin/docker"
CONTAINER = "gpufleet-ray"


def node_ip(host) -> str:
    return str(host.ansible.get_variables()["gpufleet_node_ip"])


def test_ray_unit_is_running_and_enabled(host) -> None:
    unit = host.service("gpufleet-ray")
    assert unit.is_running
    assert unit.is_enabled


def test_container_has_this_nodes_own_address_and_nic(host) -> None:
    env = host.check_output(f"{DOCKER} exec {CONTAINER} env")
    assert f"VLLM_HOST_IP={node_ip(host)}" in env.splitlines()
    assert "NCCL_SOCKET_IFNAME=eth0" in env.splitlines()
    assert "GLOO_SOCKET_IFNAME=eth0" in env.splitlines()


def test_container_mounts_the_model_read_only(host) -> None:
    mounts = json.loads(host.check_output(f"{DOCKER} inspect --format '{{{{json .Mounts}}}}' {CONTAINER}"))
    model = [m for m in mounts if m["Destination"] == "/opt/models/tiny-qwen2"]
    assert model and model[0]["Source"] == "/opt/models/tiny-qwen2" and model[0]["RW"] is False


def test_container_uses_host_network_and_the_loaded_image(host) -> None:
    info = json.loads(host.check_output(f"{DOCKER} inspect {CONTAINER}"))[0]
    assert info["HostConfig"]["NetworkMode"] == "host"
    image_id = host.check_output(f"{DOCKER} image inspect --format '{{{{.Id}}}}' gpufleet/vllm-cpu:0.32.0")
    assert info["Image"] == image_id


def test_ray_unit_was_verified_by_systemd(host) -> None:
    """The unit was written through validate: (systemd-analyze verify); it verifies on the host as written."""
    assert host.run("systemd-analyze verify /etc/systemd/system/gpufleet-ray.service").rc == 0


def test_dashboard_is_off_in_the_lab(host) -> None:
    assert not host.socket("tcp://0.0.0.0:8265").is_listening
    assert not host.socket("tcp://127.0.0.1:8265").is_listening
