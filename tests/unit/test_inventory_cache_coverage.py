"""The inventory cache never answers stale (issue 37, class 7).

Its key covers every file ansible-core reads for the inventory: any source format (YAML, INI with or without
a suffix, a hosts file given itself), group_vars and host_vars beside the source (Ansible's host_group_vars
plugin reads only those beside the inventory source when no playbook is running), reached through symlinks
too; and an entry that is not what gpufleet wrote is read through Ansible again and rewritten.

Before: a symlinked group_vars or host_vars directory was not followed (``rglob``), and a directory's
``hosts.ini`` was left out (ansible-core's default skips ``.ini`` in a directory, gpufleet's ansible.cfg does
not): an edit there was answered from the cache with the old values. A cache entry of the right JSON but
the wrong shape (variables as a list, groups of numbers) was returned as the inventory.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.fleet import inventory, inventory_cache
from gpufleet.fleet.inventory import read_inventory
from gpufleet.fleet.raw import RawInventory

from .conftest import BASE_GROUP_VARS, REPO, InventoryFactory

INI_HOSTS = """\
[ray_head]
head ansible_host=192.0.2.10 gpufleet_node_ip=10.10.0.10 gpufleet_nic=eth0 gpufleet_gpu_count=1

[ray_workers]
worker ansible_host=192.0.2.11 gpufleet_node_ip=10.10.0.11 gpufleet_nic=eth0 gpufleet_gpu_count=1

[gpu_nodes:children]
ray_head
ray_workers
"""


def head_value(path: Path, name: str) -> Any:
    (head,) = [host for host in read_inventory(path).hosts if host.name == "head"]
    return head.variables.get(name)


def ini_inventory(tmp_path: Path, hosts_name: str) -> tuple[Path, Path]:
    """An INI inventory directory; (what to pass as -i, the hosts file)."""
    directory = tmp_path / "ini"
    (directory / "group_vars").mkdir(parents=True)
    (directory / hosts_name).write_text(INI_HOSTS, encoding="utf-8")
    (directory / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump(BASE_GROUP_VARS), encoding="utf-8")
    return directory, directory / hosts_name


def edit_ini(hosts: Path) -> None:
    hosts.write_text(hosts.read_text().replace("gpufleet_gpu_count=1", "gpufleet_gpu_count=2", 1))


@pytest.fixture
def gpufleet_ansible_cfg(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpufleet's own ansible.cfg, as `gpufleet deploy` from a checkout uses it (it does not skip .ini)."""
    monkeypatch.setenv("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))


@pytest.mark.parametrize(
    ("hosts_name", "pass_file"),
    [("hosts.ini", True), ("hosts", True), ("hosts", False), ("hosts.cfg", True), ("hosts.ini", False)],
    ids=[
        "-i hosts.ini",
        "-i hosts (INI, no suffix)",
        "directory, hosts (INI)",
        "-i hosts.cfg",
        "directory, hosts.ini",
    ],
)
def test_an_edit_to_an_ini_hosts_file_is_read_again(
    tmp_path: Path, hosts_name: str, pass_file: bool, gpufleet_ansible_cfg: None
) -> None:
    directory, hosts = ini_inventory(tmp_path, hosts_name)
    source = hosts if pass_file else directory
    assert head_value(source, "gpufleet_gpu_count") == 1
    edit_ini(hosts)
    assert head_value(source, "gpufleet_gpu_count") == 2


@pytest.mark.parametrize("pass_file", [True, False], ids=["-i hosts.ini", "directory"])
def test_an_edit_to_group_vars_beside_an_ini_source_is_read_again(tmp_path: Path, pass_file: bool) -> None:
    directory, hosts = ini_inventory(tmp_path, "hosts.ini" if pass_file else "hosts")
    source = hosts if pass_file else directory
    assert head_value(source, "vllm_service_max_model_len") == 4096
    group_vars = directory / "group_vars" / "gpu_nodes.yml"
    group_vars.write_text(group_vars.read_text().replace("4096", "2048"))
    assert head_value(source, "vllm_service_max_model_len") == 2048


def link_dir(inventory: Path, name: str, outside: Path) -> Path:
    """Move inventory/name out to ``outside`` and leave a symlink to it."""
    if (inventory / name).exists():
        shutil.move(str(inventory / name), outside)
    else:
        outside.mkdir(parents=True)
    (inventory / name).symlink_to(outside, target_is_directory=True)
    return outside


@pytest.mark.parametrize(
    "layout",
    ["group_vars directory", "host_vars directory", "group_vars/gpu_nodes directory", "group_vars file"],
)
def test_vars_reached_through_a_symlink_are_in_the_key(
    make_inventory: InventoryFactory, tmp_path: Path, layout: str
) -> None:
    inventory = make_inventory()
    shared = tmp_path / "shared"
    if layout == "group_vars directory":
        edited = link_dir(inventory, "group_vars", shared) / "gpu_nodes.yml"
    elif layout == "host_vars directory":
        edited = link_dir(inventory, "host_vars", shared) / "head.yml"
        edited.write_text("vllm_service_max_model_len: 4096\n")
    elif layout == "group_vars/gpu_nodes directory":
        shared.mkdir()
        (inventory / "group_vars" / "gpu_nodes.yml").rename(shared / "main.yml")
        (inventory / "group_vars" / "gpu_nodes").symlink_to(shared, target_is_directory=True)
        edited = shared / "main.yml"
    else:
        shared.mkdir()
        edited = shared / "gpu_nodes.yml"
        (inventory / "group_vars" / "gpu_nodes.yml").rename(edited)
        (inventory / "group_vars" / "gpu_nodes.yml").symlink_to(edited)
    assert head_value(inventory, "vllm_service_max_model_len") == 4096

    edited.write_text(edited.read_text().replace("4096", "2048"))

    assert head_value(inventory, "vllm_service_max_model_len") == 2048


def test_a_symlink_loop_in_the_inventory_is_scanned_once(make_inventory: InventoryFactory) -> None:
    directory = make_inventory()
    (directory / "group_vars" / "loop").symlink_to(directory, target_is_directory=True)
    files = inventory_cache.scan(directory)
    assert len(files) == len({path.resolve() for path in files})
    assert inventory_cache.cache_key(directory, files) is not None


def symlinked_group_vars(tmp_path: Path, make: InventoryFactory) -> Path:
    directory = make()
    link_dir(directory, "group_vars", tmp_path / "shared")
    return directory


LAYOUTS: dict[str, Callable[[Path, InventoryFactory], Path]] = {
    "YAML directory": lambda tmp, make: make(),
    "YAML hosts file": lambda tmp, make: make() / "hosts.yml",
    "INI directory (hosts.ini)": lambda tmp, make: ini_inventory(tmp, "hosts.ini")[0],
    "INI hosts file": lambda tmp, make: ini_inventory(tmp, "hosts")[1],
    "symlinked group_vars": symlinked_group_vars,
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_file_ansible_opens_is_in_the_key(
    tmp_path: Path,
    make_inventory: InventoryFactory,
    layout: str,
    monkeypatch: pytest.MonkeyPatch,
    gpufleet_ansible_cfg: None,
) -> None:
    """Whatever ansible-core opens while it reads the inventory (outside its own installation and the
    ansible.cfg files, which the key covers apart) is one of the files the key hashes."""
    source = LAYOUTS[layout](tmp_path, make_inventory)
    opened: set[str] = set()
    real_open, real_read_bytes = builtins.open, Path.read_bytes

    def note(file: Any) -> None:
        if isinstance(file, str | bytes | os.PathLike):
            name = os.path.realpath(os.fsdecode(file))
            if name.startswith(str(tmp_path.resolve())) and os.path.isfile(name):
                opened.add(name)

    def tracing_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        note(file)
        return real_open(file, *args, **kwargs)

    def tracing_read_bytes(self: Path) -> bytes:
        note(self)
        return real_read_bytes(self)

    monkeypatch.setattr(builtins, "open", tracing_open)
    monkeypatch.setattr(Path, "read_bytes", tracing_read_bytes)
    inventory._load_with_ansible(source)
    monkeypatch.undo()

    hashed = {os.path.realpath(path) for path in inventory_cache.scan(source)}
    assert opened, "the trace saw no file"
    assert opened <= hashed, sorted(opened - hashed)


def corrupt_entries() -> dict[str, Callable[[dict[str, Any]], Any]]:
    """Cache entries that are not what gpufleet wrote: each must be ignored (and rewritten)."""

    def host_field(name: str, value: Any) -> Callable[[dict[str, Any]], Any]:
        return lambda data: data | {"hosts": [host | {name: value} for host in data["hosts"]]}

    return {
        "truncated JSON": lambda data: json.dumps(data)[:40],
        "not UTF-8": lambda data: b"\xff\xfe\x00garbage",
        "JSON null": lambda data: None,
        "a JSON list": lambda data: [data],
        "hosts a string": lambda data: data | {"hosts": "head"},
        "variables a list": host_field("variables", [1, 2]),
        "variables a string": host_field("variables", "x"),
        "groups of numbers": host_field("groups", [1, 2]),
        "name a number": host_field("name", 7),
        "groups a string": host_field("groups", "gpu_nodes"),
        "a problem missing a field": lambda data: data | {"problems": [{"where": "x"}]},
        "a problem with a number": lambda data: (
            data | {"problems": [{"where": 1, "variable": "v", "found": "f", "expected": "e", "fix": "z"}]}
        ),
    }


@pytest.mark.parametrize("corruption", sorted(corrupt_entries()))
def test_a_corrupt_cache_entry_is_ignored_and_rewritten(
    make_inventory: InventoryFactory, private_cache: Path, corruption: str
) -> None:
    inventory_dir = make_inventory()
    first = read_inventory(inventory_dir)
    (entry,) = (private_cache / "inventory").iterdir()
    good = json.loads(entry.read_text())
    bad = corrupt_entries()[corruption](good)
    entry.write_bytes(bad if isinstance(bad, bytes) else json.dumps(bad).encode())

    again = read_inventory(inventory_dir)

    assert isinstance(again, RawInventory)
    assert again == first
    assert json.loads(entry.read_text()) == good


def test_a_cache_entry_that_is_a_directory_is_ignored(
    make_inventory: InventoryFactory, private_cache: Path
) -> None:
    inventory_dir = make_inventory()
    first = read_inventory(inventory_dir)
    (entry,) = (private_cache / "inventory").iterdir()
    entry.unlink()
    entry.mkdir()
    assert read_inventory(inventory_dir) == first
