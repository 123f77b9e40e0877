"""The Ansible inventory a lab writes: groups gpu_nodes > ray_head (first host) + ray_workers (the rest)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SSH_COMMON_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
DEFAULT_LAB = "gpufleet"
LAB_SSH_TIMEOUT = 60  # seconds; see render()


@dataclass(frozen=True)
class LabHost:
    """A lab host as Ansible and tests reach it."""

    name: str
    ip: str


@dataclass(frozen=True)
class LabInventory:
    """What `Lab.up()` returns: enough to reach every host, from Python or from Ansible."""

    name: str
    hosts: tuple[LabHost, ...]
    key: Path  # SSH private key for root on every host
    inventory: Path  # the Ansible inventory file written for this lab
    bridge_ip: str  # the control node's address on the lab network
    subnet: str
    offline: bool

    @property
    def ips(self) -> dict[str, str]:
        return {host.name: host.ip for host in self.hosts}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (what `gpufleet lab up --json` prints)."""
        return {
            "name": self.name,
            "hosts": [{"name": host.name, "ip": host.ip} for host in self.hosts],
            "key": str(self.key),
            "inventory": str(self.inventory),
            "bridge_ip": self.bridge_ip,
            "subnet": self.subnet,
            "offline": self.offline,
        }


def repo_lab_inventory_dir() -> Path | None:
    """<repo>/inventories/lab of the gpufleet checkout around the current directory, if any."""
    for directory in (Path.cwd(), *Path.cwd().parents):
        if (directory / "inventories" / "lab").is_dir() and (directory / "ansible.cfg").is_file():
            return directory / "inventories" / "lab"
    return None


def default_inventory_path(name: str, fallback: Path) -> Path:
    """The default lab goes to <repo>/inventories/lab/hosts.yml; other labs to ``fallback``."""
    repo = repo_lab_inventory_dir()
    return repo / "hosts.yml" if name == DEFAULT_LAB and repo is not None else fallback


def link_group_vars(inventory: Path) -> None:
    """Give an inventory outside the repo the fleet's lab settings: group_vars -> inventories/lab/group_vars.

    Ansible reads group_vars/ next to an inventory file, so ``-i <lab inventory>`` then behaves like
    ``-i inventories/lab`` for the default lab.
    """
    repo = repo_lab_inventory_dir()
    link = inventory.parent / "group_vars"
    if repo is not None and (repo / "group_vars").is_dir() and not link.exists():
        link.symlink_to(repo / "group_vars")


def render(lab: LabInventory) -> str:
    """yamllint-clean inventory text for ``lab``."""

    def host_vars(host: LabHost) -> dict[str, Any]:
        return {
            "ansible_host": host.ip,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(lab.key),
            "ansible_ssh_common_args": SSH_COMMON_ARGS,
            "ansible_python_interpreter": "/usr/bin/python3",
            # Lab hosts sit on a local bridge: SSH compression (mitogen turns it on by default) only
            # costs CPU at both ends, as on a cluster network (runner/arguments.py MITOGEN_VARS).
            "mitogen_ssh_compression": False,
            # Ansible's 10 s to connect (mitogen: to start its interpreter on the host too) is not enough
            # for a host of a lab that shares two cores with other labs (make test, three workers): a
            # molecule run failed "Connection timed out" on one host of three, mid-play (issue 33).
            "ansible_ssh_timeout": LAB_SSH_TIMEOUT,
            "gpufleet_node_ip": host.ip,
            "gpufleet_nic": "eth0",
            "gpufleet_gpu": False,
            "gpufleet_gpu_count": 0,
        }

    head, workers = lab.hosts[0], lab.hosts[1:]
    tree = {
        "all": {
            "children": {
                "gpu_nodes": {
                    "children": {
                        "ray_head": {"hosts": {head.name: host_vars(head)}},
                        "ray_workers": {"hosts": {host.name: host_vars(host) for host in workers}},
                    }
                }
            }
        }
    }
    header = (
        f"# Written by `gpufleet lab up --name {lab.name}`; "
        f"removed by `gpufleet lab down --name {lab.name}`.\n"
        f"# Lab network {lab.subnet}; the control node is {lab.bridge_ip}. Do not edit: `up` rewrites it.\n"
    )
    return header + yaml.safe_dump(
        tree, explicit_start=True, default_flow_style=False, sort_keys=False, width=1000
    )


def write(lab: LabInventory) -> None:
    lab.inventory.parent.mkdir(parents=True, exist_ok=True)
    tmp = lab.inventory.with_name(lab.inventory.name + ".tmp")
    tmp.write_text(render(lab))
    tmp.replace(lab.inventory)


# ----- services on a lab's hosts (make demo, the end-to-end tests) ------------------------------------------
# One tiny replica's settings: inventories/lab/group_vars' with a smaller KV cache (several vLLMs share the
# machine's memory)
LAB_SERVING = {"max_model_len": 512, "block_size": 32, "kv_cache_memory_gib": 0.25, "enforce_eager": True}
TINY = {"repo": "gpufleet/tiny-qwen2", "revision": "master", "dir": "/opt/models/tiny-qwen2"}
# What `make demo` serves: the tiny model as 3 replicas (one per host) and a second service on the head
DEMO_SERVICES = (
    {"name": "tiny", "model": TINY, "replicas": 3, "serving": LAB_SERVING},
    {"name": "tiny-chat", "model": TINY, "replicas": 1, "hosts": ["ray_head"], "serving": LAB_SERVING},
)


def services_inventory(
    lab_inventory: Path,
    folder: Path,
    services: Sequence[dict[str, Any]],
    key: Path | None = None,
    more: dict[str, Any] | None = None,
) -> Path:
    """An inventory in ``folder`` (written again if there) of the lab's hosts with the lab's settings, less
    the one model's (they would mean nothing beside services), and these services; the API key file ``key``
    (by default ``folder/gpufleet.apikey``, generated on the first deploy); ``more`` variables last."""
    from gpufleet.fleet.schema import VARIABLES  # noqa: PLC0415  (the schema: only when writing one)

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(lab_inventory, folder / "hosts.yml")
    lab_vars = lab_inventory.parent / "group_vars" / "gpu_nodes.yml"
    one_model = {name for name, variable in VARIABLES.items() if variable.section in ("model", "serving")}
    values = {
        name: value
        for name, value in yaml.safe_load(lab_vars.read_text(encoding="utf-8")).items()
        if name not in one_model
    }
    values["gpufleet_services"] = [dict(service) for service in services]
    values["gpufleet_api_key_file"] = str(key or folder / "gpufleet.apikey")
    values.update(more or {})
    (folder / "group_vars").mkdir(exist_ok=True)
    (folder / "group_vars" / "gpu_nodes.yml").write_text(
        yaml.safe_dump(values, sort_keys=False), encoding="utf-8"
    )
    return folder
