"""Fixtures for unit tests: real inventory directories on disk, written from a small builder."""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROD_INVENTORY = REPO / "inventories" / "prod"  # services: one service, a replica per GPU
# The same two servers as one instance, TP=2 over both (the one-model form: gpufleet_model_*, vllm_service_*)
TP_INVENTORY = REPO / "inventories" / "examples" / "tp-across-nodes"
PROD_KV_TOKENS_AS_ONE_INSTANCE = 1_352_112  # TP_INVENTORY's plan: the 3090 sizes both ranks (issue 35)
# A P/D service: Qwen2.5-1.5B as 1 prefill and 2 decode replicas on three one-H100 nodes
PD_INVENTORY = REPO / "inventories" / "examples" / "pd"

BASE_HOSTS: dict[str, Any] = {
    "gpu_nodes": {
        "children": {
            "ray_head": {
                "hosts": {
                    "head": {
                        "ansible_host": "192.0.2.10",
                        "gpufleet_node_ip": "10.10.0.10",
                        "gpufleet_nic": "eth0",
                        "gpufleet_gpu_count": 1,
                        "gpufleet_gpu_model": "NVIDIA H100 80GB HBM3",
                    }
                }
            },
            "ray_workers": {
                "hosts": {
                    "worker": {
                        "ansible_host": "192.0.2.11",
                        "gpufleet_node_ip": "10.10.0.11",
                        "gpufleet_nic": "eth0",
                        "gpufleet_gpu_count": 1,
                        "gpufleet_gpu_model": "NVIDIA H100 80GB HBM3",
                    }
                }
            },
        }
    }
}
BASE_GROUP_VARS: dict[str, Any] = {
    "gpufleet_model_repo": "Qwen/Qwen2.5-1.5B-Instruct",
    "gpufleet_model_dir": "/opt/models/Qwen2.5-1.5B-Instruct",
    "gpufleet_model_config": "../config.json",
    "vllm_service_tensor_parallel_size": 1,
    "vllm_service_pipeline_parallel_size": 2,
    "vllm_service_max_model_len": 4096,
    "vllm_service_gpu_memory_utilization": 0.9,
}

InventoryFactory = Callable[..., Path]
PdFactory = Callable[..., Path]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test reads inventories with its own, empty cache (never the user's ~/.cache/gpufleet)."""
    folder = tmp_path / "gpufleet-cache"
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(folder))
    monkeypatch.delenv("GPUFLEET_NO_CACHE", raising=False)
    return folder


@pytest.fixture
def make_inventory(tmp_path: Path) -> InventoryFactory:
    """Write an inventory directory; ``hosts``/``group_vars`` edit copies of the valid base inventory."""

    def factory(
        edit_hosts: Callable[[dict[str, Any]], None] | None = None,
        group_vars: dict[str, Any] | None = None,
        hosts_text: str | None = None,
    ) -> Path:
        directory = tmp_path / "inventory"
        directory.mkdir(exist_ok=True)
        hosts = copy.deepcopy(BASE_HOSTS)
        if edit_hosts is not None:
            edit_hosts(hosts)
        text = hosts_text if hosts_text is not None else yaml.safe_dump(hosts, sort_keys=False)
        (directory / "hosts.yml").write_text(text, encoding="utf-8")
        (directory / "group_vars").mkdir(exist_ok=True)
        variables = {**BASE_GROUP_VARS, **(group_vars or {})}
        variables = {key: value for key, value in variables.items() if value is not None}
        (directory / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump(variables), encoding="utf-8")
        shutil.copy(REPO / "models/Qwen2.5-1.5B-Instruct/config.json", tmp_path / "config.json")
        return directory

    return factory


@pytest.fixture
def pd_example(tmp_path: Path) -> PdFactory:
    """Write a copy of inventories/examples/pd: ``edit`` changes its service (a dict, as written),
    ``group_vars`` set more of group_vars/gpu_nodes.yml. Each call writes a directory of its own."""
    made: list[Path] = []

    def factory(edit: Callable[[dict[str, Any]], None] | None = None, **group_vars: Any) -> Path:
        directory = tmp_path / f"pd{len(made)}"
        shutil.copytree(PD_INVENTORY, directory)
        path = directory / "group_vars" / "gpu_nodes.yml"
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
        service = values["gpufleet_services"][0]
        service["model"]["config"] = str(REPO / "models/Qwen2.5-1.5B-Instruct/config.json")
        if edit is not None:
            edit(service)
        path.write_text(yaml.safe_dump(values | group_vars), encoding="utf-8")
        made.append(directory)
        return directory

    return factory


def module_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment to run a module of plugins/modules as a plain script (``python MODULE ARGS_FILE``): its
    shared code (plugins/module_utils) importable as an installed collection's, through a collections tree
    under ``tmp_path`` that links to this repository; ``extra`` added."""
    root = tmp_path / "collections"
    link = root / "ansible_collections" / "gpufleet" / "gpufleet"
    if not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(REPO, target_is_directory=True)
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path, **extra}


def head_vars(hosts: dict[str, Any]) -> dict[str, Any]:
    head: dict[str, Any] = hosts["gpu_nodes"]["children"]["ray_head"]["hosts"]["head"]
    return head


def worker_vars(hosts: dict[str, Any]) -> dict[str, Any]:
    worker: dict[str, Any] = hosts["gpu_nodes"]["children"]["ray_workers"]["hosts"]["worker"]
    return worker
