"""Ray's own view of the cluster, read on the head: exactly the inventory's nodes are alive in it."""

from __future__ import annotations

import json

import testinfra.utils.ansible_runner
from conftest import INVENTORY, group_hosts

testinfra_hosts = group_hosts("ray_head", 1)

DOCKER = "/usr/local/bin/docker"
CONTAINER = "gpufleet-ray"
NODES_SCRIPT = (
    "import json, logging, ray; ray.init(address='auto', logging_level=logging.ERROR, log_to_driver=False); "
    "print(json.dumps([n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']]))"
)


def test_ray_reports_every_node_from_the_head(host) -> None:
    runner = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY)
    expected = [str(runner.get_variables(node)["gpufleet_node_ip"]) for node in group_hosts("gpu_nodes", 3)]
    alive = json.loads(host.check_output(f'{DOCKER} exec {CONTAINER} python3 -c "{NODES_SCRIPT}"'))
    assert sorted(alive) == sorted(expected)
