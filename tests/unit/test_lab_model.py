"""The lab's pure parts, without root or hosts: inventory, names, cache keys, subnet choice, CLI parser."""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.commands import lab as lab_command
from gpufleet.lab import Lab, LabError
from gpufleet.lab import net as lab_net
from gpufleet.lab import rootfs as lab_rootfs
from gpufleet.lab import system as lab_sys
from gpufleet.lab.inventory import LabHost, LabInventory, render

from .conftest import REPO

YAMLLINT = Path(sys.executable).with_name("yamllint")


def inventory(nodes: int) -> LabInventory:
    hosts = tuple(LabHost(f"node{i}", f"10.231.7.{10 + i}") for i in range(1, nodes + 1))
    return LabInventory(
        "t", hosts, Path("/k/id_ed25519"), Path("/i/hosts.yml"), "10.231.7.1", "10.231.7.0/24", True
    )


def test_inventory_puts_the_first_host_at_the_head_and_the_rest_as_workers() -> None:
    tree = yaml.safe_load(render(inventory(3)))
    groups = tree["all"]["children"]["gpu_nodes"]["children"]
    assert list(groups["ray_head"]["hosts"]) == ["node1"]
    assert list(groups["ray_workers"]["hosts"]) == ["node2", "node3"]
    node2 = groups["ray_workers"]["hosts"]["node2"]
    assert node2["ansible_host"] == node2["gpufleet_node_ip"] == "10.231.7.12"
    assert (node2["ansible_user"], node2["ansible_ssh_private_key_file"]) == ("root", "/k/id_ed25519")
    assert (node2["gpufleet_nic"], node2["gpufleet_gpu"], node2["gpufleet_gpu_count"]) == ("eth0", False, 0)
    assert "StrictHostKeyChecking=no" in node2["ansible_ssh_common_args"]


def test_lab_hosts_give_ansible_a_minute_to_connect() -> None:
    """A lab host shares two cores with other labs under make test: Ansible's 10 s to connect (mitogen's to
    start its interpreter) timed out mid-play (issue 33). The variable must be the one the ssh connection
    plugin reads its timeout from (mitogen reads the same option)."""
    from ansible.plugins.connection import ssh

    groups = yaml.safe_load(render(inventory(2)))["all"]["children"]["gpu_nodes"]["children"]
    host = groups["ray_head"]["hosts"]
    timeout_vars = {var["name"] for var in yaml.safe_load(ssh.DOCUMENTATION)["options"]["timeout"]["vars"]}
    assert host["node1"]["ansible_ssh_timeout"] == 60
    assert "ansible_ssh_timeout" in timeout_vars


def test_one_host_lab_has_an_empty_workers_group() -> None:
    groups = yaml.safe_load(render(inventory(1)))["all"]["children"]["gpu_nodes"]["children"]
    assert groups["ray_workers"]["hosts"] == {}


def test_inventory_passes_the_repositorys_yamllint(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text(render(inventory(3)))
    result = subprocess.run(
        [str(YAMLLINT), "--strict", "-c", str(REPO / ".yamllint"), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("name", ["", "Bad", "has space", "-dash", "x" * 41, "a/b"])
def test_bad_lab_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(LabError, match="expected 1-40 characters"):
        Lab(name)


def test_node_count_is_checked() -> None:
    with pytest.raises(LabError, match="--nodes: found 0"):
        Lab("ok", nodes=0)


def test_a_baked_file_changes_only_the_layer_key(monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = lab_rootfs.DEFAULT_MIRROR
    base, layer = lab_rootfs.base_key("bookworm", mirror), lab_rootfs.layer_key("bookworm", mirror)
    monkeypatch.setattr(lab_rootfs, "LAYER_FILES", {**lab_rootfs.LAYER_FILES, "etc/motd": "lab\n"})
    assert lab_rootfs.base_key("bookworm", mirror) == base
    assert lab_rootfs.layer_key("bookworm", mirror) != layer


def test_the_package_list_and_the_suite_change_the_base_key(monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = lab_rootfs.DEFAULT_MIRROR
    base = lab_rootfs.base_key("bookworm", mirror)
    assert lab_rootfs.base_key("trixie", mirror) != base
    monkeypatch.setattr(lab_rootfs, "PACKAGES", (*lab_rootfs.PACKAGES, "less"))
    assert lab_rootfs.base_key("bookworm", mirror) != base


def test_a_new_lab_takes_the_first_subnet_nobody_routes_or_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab_net, "routed_subnets", lambda: [ipaddress.IPv4Network("10.231.1.0/24")])
    assert lab_net.free_index({2}) == 3
    assert (lab_net.bridge_ip(3), lab_net.host_ip(3, 1)) == ("10.231.3.1", "10.231.3.11")


def test_unknown_suite_is_refused() -> None:
    with pytest.raises(LabError, match="--suite: found 'sid'"):
        lab_rootfs.ensure_rootfs("sid")


def test_cli_has_every_action() -> None:
    parser = argparse.ArgumentParser(prog="gpufleet")
    lab_command.register(parser.add_subparsers(dest="command"))
    up = parser.parse_args(["lab", "up", "--nodes", "2", "--offline", "--name", "x"])
    assert (up.nodes, up.offline, up.name, up.suite) == (2, True, "x", "bookworm")
    down, reset = parser.parse_args(["lab", "down"]), parser.parse_args(["lab", "reset"])
    assert (down.name, reset.name) == ("gpufleet", "gpufleet")
    status = parser.parse_args(["lab", "status", "--json", "--name", "x"])
    assert (status.json, status.name) == (True, "x")
    ssh = parser.parse_args(["lab", "ssh", "node2", "systemctl", "is-active", "ssh"])
    assert (ssh.node, ssh.remote) == ("node2", ["systemctl", "is-active", "ssh"])
    # Each action reaches its own handler (behind the guard that turns a LabError into one line).
    handlers = [args.func.__wrapped__ for args in (up, down, reset, status, ssh)]
    assert handlers == [lab_command._up, lab_command._down, lab_command._reset, lab_command._status,
                        lab_command._ssh]  # fmt: skip


def test_missing_tools_are_named_with_the_apt_get_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab_sys.shutil, "which", lambda cmd: None if cmd in ("systemd-nspawn", "ip") else cmd)
    problems = lab_sys.missing_prerequisites()
    expected = "lab: packages: missing iproute2, systemd-container. Fix: apt-get install -y "
    assert expected + "iproute2 systemd-container" in problems
