"""Issue 37, class 4: node addresses the other nodes cannot reach, an address YAML read as a number, and a
model directory that is the root or a system directory are refused by validate, as the roles refuse them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.fleet import validate_inventory
from gpufleet.fleet.schema import SYSTEM_DIRS, SYSTEM_TREES

from .conftest import BASE_HOSTS, REPO, InventoryFactory, head_vars


def problems(path: Path) -> list[str]:
    return [str(problem) for problem in validate_inventory(path).problems]


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("127.0.0.1", "loopback"),
        ("127.1.2.3", "loopback"),
        ("::1", "loopback"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "broadcast"),
    ],
)
def test_a_node_address_the_others_cannot_reach_is_refused(
    make_inventory: InventoryFactory, address: str, kind: str
) -> None:
    def set_ip(hosts: dict[str, Any]) -> None:
        head_vars(hosts)["gpufleet_node_ip"] = address

    found = [line for line in problems(make_inventory(set_ip)) if "gpufleet_node_ip" in line]
    assert found and f"not a {kind} one" in found[0] and found[0].startswith("host head:"), found


@pytest.mark.parametrize("unquoted", ["10:10:10", "1:2:3:4"])
def test_an_unquoted_address_yaml_reads_as_a_number_is_refused(
    make_inventory: InventoryFactory, unquoted: str
) -> None:
    text = yaml.safe_dump(BASE_HOSTS, sort_keys=False).replace(
        "gpufleet_node_ip: 10.10.0.10", f"gpufleet_node_ip: {unquoted}"
    )
    assert unquoted in text

    found = [line for line in problems(make_inventory(hosts_text=text)) if "gpufleet_node_ip" in line]
    assert found and "YAML read a number" in found[0] and "Quote it" in found[0], found


@pytest.mark.parametrize("address", ["10.0.0.5", "fd00::5", "192.168.1.20"])
def test_a_cluster_address_is_accepted(make_inventory: InventoryFactory, address: str) -> None:
    def set_ip(hosts: dict[str, Any]) -> None:
        head_vars(hosts)["gpufleet_node_ip"] = address

    assert [line for line in problems(make_inventory(set_ip)) if "gpufleet_node_ip" in line] == []


@pytest.mark.parametrize(
    ("directory", "said"),
    [
        ("/", "not /"),
        ("//", "not /"),
        ("/usr", "not /usr"),
        ("/usr/", "not /usr"),
        ("/opt", "not /opt"),
        ("/var/lib", "not /var/lib"),
        ("/home", "not /home"),
        ("/etc/models", "not /etc/models"),
        ("/proc/models", "not /proc/models"),
        ("/opt/models/../../etc", "without '..' parts"),
        ("models/qwen", "an absolute path"),
    ],
)
def test_a_model_directory_that_is_no_models_own_is_refused(
    make_inventory: InventoryFactory, directory: str, said: str
) -> None:
    found = [
        line
        for line in problems(make_inventory(group_vars={"gpufleet_model_dir": directory}))
        if "model_dir" in line
    ]
    assert found and said in found[0], found


@pytest.mark.parametrize("directory", ["/opt/models/q", "/srv/models/q", "/var/lib/models/q", "/data/q/"])
def test_a_models_own_directory_is_accepted(make_inventory: InventoryFactory, directory: str) -> None:
    assert problems(make_inventory(group_vars={"gpufleet_model_dir": directory})) == []


def test_the_role_refuses_the_same_directories() -> None:
    """model_fetch checks gpufleet_model_dir on the hosts with the same lists (plain ansible-playbook)."""
    role = yaml.safe_load((REPO / "roles" / "model_fetch" / "vars" / "main.yml").read_text(encoding="utf-8"))
    assert tuple(role["__model_fetch_system_dirs"]) == SYSTEM_DIRS
    assert tuple(role["__model_fetch_system_trees"]) == SYSTEM_TREES
    assert all(tree.count("/") == 1 for tree in SYSTEM_TREES)  # the role compares the first part only


@pytest.mark.parametrize("name", ["ray_workers", "gpu_nodes", "all"])
def test_a_host_named_like_a_group_is_refused_by_validate(
    make_inventory: InventoryFactory, name: str
) -> None:
    """Ansible warns and then takes the group for the name in every pattern (hosts:, --limit)."""
    text = yaml.safe_dump(BASE_HOSTS, sort_keys=False).replace("    worker:", f"    {name}:")

    found = [line for line in problems(make_inventory(hosts_text=text)) if "also the name of a group" in line]
    assert found and found[0].startswith(f"host {name}: inventory_hostname: found "), found
