"""Every lab host is a real systemd host: systemd up, sshd, its own name, shm and cgroups, and a network
on which the hosts reach each other by name."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import VENV_BIN, RunningLab, ansible_env

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

HOSTS = ("node1", "node2", "node3")
# Units allowed to fail in a lab host (`systemctl is-system-running` = degraded). None fails today;
# name any future one here with the reason.
EXPECTED_FAILED_UNITS: frozenset[str] = frozenset()


@pytest.mark.parametrize("host", HOSTS)
def test_systemd_is_running(lab: RunningLab, host: str) -> None:
    state = lab.ssh(host, "systemctl is-system-running --wait").stdout.strip()
    failed = set(
        lab.ssh(host, "systemctl list-units --failed --plain --no-legend | cut -d' ' -f1").stdout.split()
    )
    assert state == "running" or (state == "degraded" and failed <= EXPECTED_FAILED_UNITS), (state, failed)


@pytest.mark.parametrize("host", HOSTS)
def test_sshd_answers_on_the_host_address(lab: RunningLab, host: str) -> None:
    with socket.create_connection((lab.inventory.ips[host], 22), timeout=5) as connection:
        assert connection.recv(64).startswith(b"SSH-2.0-OpenSSH")


@pytest.mark.parametrize("host", HOSTS)
def test_hostname_is_the_inventory_name(lab: RunningLab, host: str) -> None:
    assert lab.ssh(host, "hostname").stdout.strip() == host


@pytest.mark.parametrize("host", HOSTS)
def test_every_host_name_resolves_to_its_lab_address(lab: RunningLab, host: str) -> None:
    lines = lab.ssh(host, ["getent", "ahostsv4", *HOSTS]).stdout.splitlines()
    resolved = {line.split()[2]: line.split()[0] for line in lines if len(line.split()) == 3}
    assert resolved == lab.inventory.ips


@pytest.mark.parametrize(("source", "target"), list(itertools.permutations(HOSTS, 2)))
def test_tcp_between_hosts_by_name(lab: RunningLab, source: str, target: str) -> None:
    banner = lab.ssh(source, f"timeout 5 bash -c 'exec 3<>/dev/tcp/{target}/22; head -c 7 <&3'")
    assert banner.stdout == "SSH-2.0", banner.stderr


@pytest.mark.parametrize("host", HOSTS)
def test_sysfs_lists_only_the_hosts_own_network_devices(lab: RunningLab, host: str) -> None:
    # Ansible's facts read /sys/class/net: the machine's interfaces there would fool preflight's NIC check.
    devices = set(lab.ssh(host, "ls /sys/class/net").stdout.split())
    links = {
        line.split(":")[1].strip().split("@")[0] for line in lab.ssh(host, "ip -o link").stdout.splitlines()
    }
    assert devices == links
    assert "eth0" in devices


def test_each_host_has_its_own_dev_shm(lab: RunningLab) -> None:
    assert lab.ssh("node1", "findmnt -n -o FSTYPE /dev/shm").stdout.strip() == "tmpfs"
    assert lab.ssh("node1", "echo node1 > /dev/shm/gpufleet-owner").returncode == 0
    try:
        assert lab.ssh("node2", "test ! -e /dev/shm/gpufleet-owner").returncode == 0
    finally:
        lab.ssh("node1", "rm -f /dev/shm/gpufleet-owner")


@pytest.mark.parametrize("host", HOSTS)
def test_cgroup_controllers_are_writable_for_dockerd(lab: RunningLab, host: str) -> None:
    assert "rw" in lab.ssh(host, "findmnt -n -o OPTIONS /sys/fs/cgroup/cpuset").stdout.split(",")


def test_inventory_groups_and_host_variables(lab: RunningLab) -> None:
    listing = subprocess.run(
        [str(VENV_BIN / "ansible-inventory"), "-i", str(lab.inventory.inventory), "--list"],
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    inventory = json.loads(listing.stdout)
    assert inventory["gpu_nodes"]["children"] == ["ray_head", "ray_workers"]
    assert inventory["ray_head"]["hosts"] == ["node1"]
    assert inventory["ray_workers"]["hosts"] == ["node2", "node3"]
    node2 = inventory["_meta"]["hostvars"]["node2"]
    assert node2["ansible_host"] == node2["gpufleet_node_ip"] == lab.inventory.ips["node2"]
    assert (node2["gpufleet_nic"], node2["gpufleet_gpu"], node2["gpufleet_gpu_count"]) == ("eth0", False, 0)


def test_playbook_helper_reaches_every_host(lab: RunningLab, tmp_path: Path) -> None:
    playbook = tmp_path / "facts.yml"
    playbook.write_text(
        "- name: Gather facts from every lab host\n"
        "  hosts: gpu_nodes\n"
        "  tasks:\n"
        "    - name: Say whether the host carries its gpufleet_node_ip\n"
        "      ansible.builtin.debug:\n"
        '        msg: "{{ inventory_hostname }} has-ip={{ gpufleet_node_ip in addresses }}"\n'
        "      vars:\n"
        "        addresses: \"{{ ansible_facts['all_ipv4_addresses'] }}\"\n"
    )
    result = lab.playbook(playbook)
    assert result.returncode == 0, result.stdout
    for host in HOSTS:
        assert f"{host} has-ip=True" in result.stdout


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "gpufleet"), "lab", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_cli_status_json_lists_every_host_with_ssh_answering(lab: RunningLab) -> None:
    result = gpufleet("status", "--json", "--name", lab.inventory.name)
    assert result.returncode == 0, result.stderr
    hosts = json.loads(result.stdout)["hosts"]
    assert [(host["name"], host["ip"], host["ssh"]) for host in hosts] == [
        (name, lab.inventory.ips[name], True) for name in HOSTS
    ]
    assert {host["systemd"] for host in hosts} <= {"running", "degraded"}


def test_cli_ssh_runs_a_command_on_the_named_host(lab: RunningLab) -> None:
    result = gpufleet("ssh", "--name", lab.inventory.name, "node3", "cat", "/etc/hostname")
    assert (result.returncode, result.stdout.strip()) == (0, "node3"), result.stderr
