"""The Ray cluster as the nodes see it: units, each container's own address and NIC, Ray's view."""

from __future__ import annotations

import json
import os

import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(
    os.environ["MOLECULE_INVENTORY_FILE"]
).get_hosts("gpu_nodes")

DOCKER = "/usr/local/bin/docker"
CONTAINER = "gpufleet-ray"
NODES_SCRIPT = (
    "import json, logging, ray; ray.init(address='auto', logging_level=logging.ERROR, log_to_driver=False); "
    "print(json.dumps([n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']]))"
)


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


def test_ray_reports_every_node_from_the_head(host) -> None:
    if "ray_head" not in host.ansible.get_variables()["group_names"]:
        return
    alive = json.loads(host.check_output(f'{DOCKER} exec {CONTAINER} python3 -c "{NODES_SCRIPT}"'))
    assert len(alive) == 3
    assert node_ip(host) in alive


def test_dashboard_is_off_in_the_lab(host) -> None:
    assert not host.socket("tcp://0.0.0.0:8265").is_listening
    assert not host.socket("tcp://127.0.0.1:8265").is_listening
