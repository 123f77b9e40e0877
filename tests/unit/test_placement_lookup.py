"""The lookup gpufleet_placement: the playbooks (serve.yml, gateway.yml) read the placement `gpufleet plan`
shows, through the same typed loader; an inventory without services has no replicas to run one by one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleError
from ansible.plugins.loader import lookup_loader

REPO = Path(__file__).resolve().parents[2]


def lookup(what: str, inventory: Path, **options: Any) -> list[Any]:
    lookup_loader.add_directory(str(REPO / "plugins/lookup"))  # as ansible.cfg's lookup_plugins
    plugin = lookup_loader.get("gpufleet_placement")
    assert plugin is not None
    found: list[Any] = plugin.run(
        [what], variables={"ansible_inventory_sources": [str(inventory)]}, **options
    )
    return found


def test_each_replica_has_its_node_gpus_port_url_and_its_services_settings() -> None:
    replicas = lookup("replicas", REPO / "inventories/prod")
    assert [
        (r["id"], r["node"], r["nodes"], r["gpus"], r["port"], r["url"], r["executor"]) for r in replicas
    ] == [
        ("qwen-0", "gpu-head-01", ["gpu-head-01"], [0], 8100, "http://10.10.0.10:8100", "mp"),
        ("qwen-1", "gpu-worker-01", ["gpu-worker-01"], [0], 8100, "http://10.10.0.11:8100", "mp"),
    ]
    first = replicas[0]
    assert first["name"] == "qwen2.5-1.5b-instruct"  # serving.served_model_name: what clients send
    assert first["model"] == {
        "repo": "Qwen/Qwen2.5-1.5B-Instruct",
        "revision": "master",
        "dir": "/opt/models/Qwen2.5-1.5B-Instruct",
    }
    assert first["serving"]["max_model_len"] == 8192 and first["serving"]["gpu_memory_utilization"] == 0.9
    assert "port" not in first["serving"] and "served_model_name" not in first["serving"]
    assert first["image"] is None  # the fleet's image (a service's own `image` otherwise)
    # where the inventory sets no ray_cluster_image, the fleet's is the ray_cluster role's default: a services
    # inventory runs no Ray container to take it from
    defaults = yaml.safe_load((REPO / "roles/ray_cluster/defaults/main.yml").read_text(encoding="utf-8"))
    assert first["fleet_image"] == defaults["ray_cluster_image"]


def test_the_gateway_gets_a_router_per_service_with_its_replicas_as_workers(tmp_path: Path) -> None:
    inventory = tmp_path / "services"
    shutil.copytree(REPO / "inventories/prod", inventory)
    variables = inventory / "group_vars/gpu_nodes.yml"
    values = yaml.safe_load(variables.read_text(encoding="utf-8"))
    second = {**values["gpufleet_services"][0], "name": "other", "replicas": 1}
    second["serving"] = {**second["serving"], "served_model_name": "other", "gpu_memory_utilization": 0.4}
    values["gpufleet_services"][0]["serving"]["gpu_memory_utilization"] = 0.4
    values["gpufleet_services"][0]["replicas"] = 2
    values["gpufleet_services"].append(second)
    for service in values["gpufleet_services"]:
        service["model"]["config"] = str(REPO / "models/Qwen2.5-1.5B-Instruct/config.json")
    variables.write_text(yaml.safe_dump(values), encoding="utf-8")
    head = inventory / "hosts.yml"
    head.write_text(
        head.read_text(encoding="utf-8").replace("gpufleet_gpu_count: 1", "gpufleet_gpu_count: 2")
    )

    assert lookup("gateway", inventory, first_port=9000, first_metrics_port=9100) == [
        {  # a router per service, named as the service (a unit name); model: what its clients send
            "name": "qwen",
            "model": "qwen2.5-1.5b-instruct",
            "port": 9000,
            "metrics_port": 9100,
            "workers": ["http://10.10.0.10:8100", "http://10.10.0.11:8100"],
        },
        {
            "name": "other",
            "model": "other",
            "port": 9001,
            "metrics_port": 9101,
            "workers": ["http://10.10.0.10:8101"],
        },
    ]
    assert lookup("models", inventory) == [  # both services serve the one model: fetched once
        {
            "repo": "Qwen/Qwen2.5-1.5B-Instruct",
            "revision": "master",
            "dir": "/opt/models/Qwen2.5-1.5B-Instruct",
        }
    ]
    replicas = lookup("replicas", inventory)
    assert [(r["id"], r["node"], r["gpus"]) for r in replicas] == [
        ("qwen-0", "gpu-head-01", [0]),
        ("qwen-1", "gpu-worker-01", [0]),
        ("other-0", "gpu-head-01", [1]),
    ]


def test_an_inventory_without_services_has_no_replicas_and_no_routers() -> None:
    one_model = REPO / "inventories/examples/tp-across-nodes"  # one instance, TP=2 over both servers
    assert lookup("replicas", one_model) == []
    assert lookup("gateway", one_model) == []
    assert lookup("models", one_model) == []


def test_an_invalid_inventory_or_term_is_refused_with_the_problems(tmp_path: Path) -> None:
    inventory = tmp_path / "services"
    shutil.copytree(REPO / "inventories/prod", inventory)
    variables = inventory / "group_vars/gpu_nodes.yml"
    values = yaml.safe_load(variables.read_text(encoding="utf-8"))
    values["gpufleet_services"].append(dict(values["gpufleet_services"][0]))  # the same name twice
    variables.write_text(yaml.safe_dump(values), encoding="utf-8")
    with pytest.raises(AnsibleError, match="found 'qwen' twice"):
        lookup("replicas", inventory)
    with pytest.raises(
        AnsibleError, match="found 'nodes'; expected one of replicas, gateway, models, metrics"
    ):
        lookup("nodes", REPO / "inventories/prod")


def services_copy(tmp_path: Path) -> Path:
    inventory = tmp_path / "services"
    shutil.copytree(REPO / "inventories/prod", inventory)
    return inventory


def test_the_next_ask_answers_from_the_kept_placement_without_loading_the_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: Ansible asks the lookup in a worker process of its own for every play and host; each ask
    loaded and validated the inventory again (about 0.5 s of CPU, a quarter of a serve stage's controller
    CPU). The first ask keeps the placement; the next ones read it, the inventory neither loaded nor
    validated."""
    from gpufleet.fleet import loaded

    inventory = services_copy(tmp_path)
    first = lookup("replicas", inventory)
    assert [replica["id"] for replica in first] == ["qwen-0", "qwen-1"]

    def refuse(path: Path) -> None:
        raise AssertionError(f"the inventory {path} was loaded again")

    monkeypatch.setattr(loaded, "load", refuse)
    assert lookup("replicas", inventory) == first
    assert [router["workers"] for router in lookup("gateway", inventory)] == [[r["url"] for r in first]]


def test_a_changed_inventory_or_role_default_is_placed_again_and_an_invalid_one_is_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept placement is keyed by what it depends on: an edited inventory gives its own placement, a
    changed role file (the validator reads the roles' specs and defaults) loads it again, an inventory made
    invalid is refused on every ask (nothing of it kept), and GPUFLEET_NO_CACHE=1 loads every time."""
    from gpufleet.fleet import loaded, placement_cache

    inventory = services_copy(tmp_path)
    variables = inventory / "group_vars/gpu_nodes.yml"
    values = yaml.safe_load(variables.read_text(encoding="utf-8"))
    assert len(lookup("replicas", inventory)) == 2
    values["gpufleet_services"][0]["replicas"] = 1
    variables.write_text(yaml.safe_dump(values), encoding="utf-8")
    assert [replica["id"] for replica in lookup("replicas", inventory)] == ["qwen-0"]

    loads: list[Path] = []
    real_load = loaded.load

    def counted(path: Path) -> Any:
        loads.append(path)
        return real_load(path)

    monkeypatch.setattr(loaded, "load", counted)
    roles = tmp_path / "roles-copy"
    shutil.copytree(REPO, roles, ignore=shutil.ignore_patterns(".*", "build", "tests", "src", "docs"))
    monkeypatch.setenv("GPUFLEET_HOME", str(roles))
    assert len(lookup("replicas", inventory)) == 1 and len(loads) == 1  # other role files: loaded again
    assert len(lookup("replicas", inventory)) == 1 and len(loads) == 1  # then kept
    defaults = roles / "roles/vllm_service/defaults/main.yml"
    defaults.write_text(defaults.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    assert len(lookup("replicas", inventory)) == 1 and len(loads) == 2
    plugin = roles / "plugins/lookup/gpufleet_placement.py"  # the lookup's own code: what it answers
    plugin.write_text(plugin.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    assert len(lookup("replicas", inventory)) == 1 and len(loads) == 3

    values["gpufleet_services"].append(dict(values["gpufleet_services"][0]))  # the same name twice
    variables.write_text(yaml.safe_dump(values), encoding="utf-8")
    for _ in range(2):
        with pytest.raises(AnsibleError, match="found 'qwen' twice"):
            lookup("replicas", inventory)
    assert len(loads) == 5
    assert placement_cache.placement_key(inventory) is not None

    monkeypatch.setenv("GPUFLEET_NO_CACHE", "1")
    values["gpufleet_services"].pop()
    variables.write_text(yaml.safe_dump(values), encoding="utf-8")
    lookup("replicas", inventory)
    lookup("replicas", inventory)
    assert len(loads) == 7
