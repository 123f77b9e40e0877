"""Services in the inventory (fleet/services.py): read, validated, placed and planned per replica."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.cli import main
from gpufleet.fleet import load, validate_inventory
from gpufleet.fleet.services import not_deployable, place_fleet, served, services_of

from .conftest import (
    PROD_INVENTORY,
    PROD_KV_TOKENS_AS_ONE_INSTANCE,
    TP_INVENTORY,
    InventoryFactory,
    head_vars,
)

ONE_MODEL = {  # the base inventory's one-model variables, cleared: services say their own
    name: None
    for name in (
        "gpufleet_model_repo",
        "gpufleet_model_dir",
        "gpufleet_model_config",
        "vllm_service_tensor_parallel_size",
        "vllm_service_pipeline_parallel_size",
        "vllm_service_max_model_len",
        "vllm_service_gpu_memory_utilization",
    )
}


def service(name: str, **more: Any) -> dict[str, Any]:
    model = {"repo": "Qwen/Qwen2.5-1.5B-Instruct", "dir": f"/opt/models/{name}", "config": "../config.json"}
    return {"name": name, "model": model, **more}


def with_services(make_inventory: InventoryFactory, *services: dict[str, Any], **more: Any) -> Path:
    return make_inventory(group_vars={**ONE_MODEL, "gpufleet_services": list(services), **more})


def problems_of(path: Path) -> list[str]:
    return [str(problem) for problem in validate_inventory(path).problems]


def test_prod_places_one_replica_per_gpu_with_twice_the_kv_tokens_of_one_tp_instance(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The TP example plans one TP=2 instance over both servers, sized by the 3090; the same servers as
    services (inventories/prod) plan a replica per GPU, each on its own memory."""
    assert main(["plan", "-i", str(TP_INVENTORY), "--json"]) == 0
    one_instance = json.loads(capsys.readouterr().out)["kv_cache_tokens"]
    assert main(["plan", "-i", str(PROD_INVENTORY), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    replicas = planned["replicas"]
    assert [(r["replica"], r["node"], r["members"], r["executor"]) for r in replicas] == [
        ("qwen-0", "gpu-head-01", [{"node": "gpu-head-01", "gpus": [0]}], "mp"),
        ("qwen-1", "gpu-worker-01", [{"node": "gpu-worker-01", "gpus": [0]}], "mp"),
    ]
    head, worker = (r["kv_cache_tokens"] for r in replicas)
    assert worker > 3 * head  # the H800's replica is planned on the H800, not on the 3090's memory
    assert planned["services"] == [{"name": "qwen", "replicas": 2, "kv_cache_tokens": head + worker}]
    assert head + worker >= 2 * one_instance


def test_issue_35_is_done_prod_places_two_replicas_with_twice_the_kv_tokens_of_before(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 35's done-criterion: `gpufleet plan -i inventories/prod --json` places two replicas whose KV
    tokens add up to at least twice those of the one TP=2 instance prod was before (1,352,112)."""
    assert main(["plan", "-i", str(TP_INVENTORY), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_cache_tokens"] == PROD_KV_TOKENS_AS_ONE_INSTANCE
    assert main(["plan", "-i", str(PROD_INVENTORY), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert (planned["errors"], len(planned["replicas"])) == ([], 2)
    assert sum(r["kv_cache_tokens"] for r in planned["replicas"]) >= 2 * 1_352_112


def test_the_table_shows_every_replica_and_the_service_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-i", str(PROD_INVENTORY)]) == 0
    out = capsys.readouterr().out
    assert "qwen-0" in out and "qwen-1" in out
    assert "qwen: 2 replica(s)" in out


def test_an_inventory_before_services_is_one_service_with_one_replica_over_every_gpu() -> None:
    fleet = load(TP_INVENTORY).require()
    (only,) = services_of(fleet)
    assert (only.name, only.replicas, only.model) == ("default", 1, fleet.model)
    assert only.serving.served_model_name == "qwen2.5-1.5b-instruct"  # what clients send, as before
    (replica,) = place_fleet(fleet).replicas
    assert replica.id == "default"  # today's instance (vllm_service_instance_id): nothing moves
    assert [(m.node, m.gpus) for m in replica.members] == [("gpu-head-01", (0,)), ("gpu-worker-01", (0,))]
    assert (replica.executor, replica.port) == ("ray", 8000)


@pytest.mark.parametrize(
    ("services", "more", "said"),
    [
        (
            [service("a", replicas=1), service("b", replicas="auto")],  # b takes the GPU a left
            {},
            "2 service(s): a (Qwen/Qwen2.5-1.5B-Instruct) as 1 replica(s) of 1 GPU(s); "
            "b (Qwen/Qwen2.5-1.5B-Instruct) as 1 replica(s) of 1 GPU(s), replicas: auto",
        ),
        (
            [service("a", replicas=3)],
            {"gpufleet_gpu": False},  # the CPU build of vLLM (the lab): one-rank replicas, no GPU
            "1 service(s): a (Qwen/Qwen2.5-1.5B-Instruct) as 3 replica(s) on CPU",
        ),
    ],
    ids=["auto-and-a-number", "cpu"],
)
def test_validate_says_what_each_service_serves_as_placed(
    make_inventory: InventoryFactory, services: list[dict[str, Any]], more: dict[str, Any], said: str
) -> None:
    """`gpufleet validate`'s summary names each service's model and its replicas as the planner placed them
    (`auto` counted), not one model for the fleet."""
    path = with_services(make_inventory, *services, **more)
    assert problems_of(path) == []
    assert served(load(path).require()) == said


def test_hosts_may_name_groups(make_inventory: InventoryFactory) -> None:
    path = with_services(make_inventory, service("a", hosts=["ray_workers"], replicas="auto"))
    assert problems_of(path) == []
    assert [r.node for r in place_fleet(load(path).require()).replicas] == ["worker"]


def test_validation_refuses_in_one_line_each(make_inventory: InventoryFactory) -> None:
    path = with_services(
        make_inventory,
        service("a", replicas=2),
        service("a"),
    )
    assert problems_of(path) == [
        "gpufleet_services: service a: name: found 'a' twice; expected one name per service (clients send "
        "it as `model`). Fix: rename one of the two services named a"
    ]
    path = with_services(make_inventory, service("a", replicas=3))  # two GPUs in the fleet
    assert problems_of(path) == [
        "gpufleet_services: service a: replicas: found 3 of 1 GPUs each; expected at most 2 (the GPUs left "
        "on its nodes fit 2). Fix: set replicas to 2"
    ]
    path = with_services(make_inventory, service("a", serving={"tensor_parallel_size": 2}))
    assert "tensor parallelism stays inside a node" in " ".join(problems_of(path))
    path = with_services(make_inventory, service("a", hosts=["nowhere"]))
    assert "hosts: found nowhere" in " ".join(problems_of(path))
    path = with_services(
        make_inventory, service("a", serving={"port": 9000}), service("b", serving={"port": 9000})
    )
    assert problems_of(path) == []  # one replica each, on different nodes

    def two_gpus_on_head(hosts: dict[str, Any]) -> None:
        head_vars(hosts)["gpufleet_gpu_count"] = 2

    path = make_inventory(
        two_gpus_on_head,
        group_vars={
            **ONE_MODEL,
            "gpufleet_services": [
                service("a", serving={"port": 9000}, hosts=["head"]),
                service("b", serving={"port": 9000}, hosts=["head"]),
            ],
        },
    )
    assert "port: found 9000, taken on head" in " ".join(problems_of(path))


def test_a_malformed_service_is_named_by_its_position_and_field(make_inventory: InventoryFactory) -> None:
    path = with_services(make_inventory, {"name": "Bad Name", "model": {"repo": "x"}, "replicas": 0})
    said = problems_of(path)
    assert any(line.startswith("gpufleet_services[0] (Bad Name): name:") for line in said), said
    assert any(": model.dir: found nothing" in line for line in said), said
    assert any(": replicas:" in line and "auto" in line for line in said), said


def test_one_model_variables_beside_services_are_refused(make_inventory: InventoryFactory) -> None:
    path = make_inventory(group_vars={"gpufleet_services": [service("a")]})
    said = problems_of(path)
    beside = (
        "group gpu_nodes: gpufleet_model_repo: found 'Qwen/Qwen2.5-1.5B-Instruct' beside gpufleet_services"
    )
    assert any(line.startswith(beside) for line in said), said


def test_a_replica_vllm_would_refuse_on_its_own_gpus_is_named(make_inventory: InventoryFactory) -> None:
    """Each replica is planned on its own GPUs: a context too long for one H100's KV cache at a low
    utilization is refused for each replica, by its id."""
    path = with_services(
        make_inventory,
        service("a", replicas=2, serving={"max_model_len": 32768, "gpu_memory_utilization": 0.05}),
    )
    said = problems_of(path)
    assert [line.split(": serving (planner)")[0] for line in said] == [
        "gpufleet_services: a-0",
        "gpufleet_services: a-1",
    ], said


def test_a_deploy_refuses_a_replica_over_nodes_before_any_host_is_touched(
    make_inventory: InventoryFactory,
) -> None:
    """A service's replicas run inside one node each (playbooks/serve.yml); one that needs two nodes is
    refused by deploy() in one line naming it, before any stage runs."""
    from gpufleet.problems import InventoryError
    from gpufleet.runner import deploy

    spanning = with_services(make_inventory, service("a", serving={"pipeline_parallel_size": 2}))
    with pytest.raises(InventoryError) as refused:
        deploy(spanning)
    assert str(refused.value).startswith(
        "gpufleet_services: a-0: serving (tensor_parallel_size x pipeline_parallel_size): found a replica "
        "over 2 nodes ("
    ), str(refused.value)
    fleet = load(with_services(make_inventory, service("a", replicas=2))).require()
    assert not_deployable(fleet) == []  # one GPU each: deployed


def test_services_not_written_as_a_list_of_mappings_get_one_line(make_inventory: InventoryFactory) -> None:
    assert problems_of(make_inventory(group_vars={**ONE_MODEL, "gpufleet_services": "qwen"})) == [
        "group gpu_nodes: gpufleet_services: found 'qwen'; expected a list of services, each a mapping with "
        "name, model and replicas. Fix: write gpufleet_services as a YAML list (see the README's Services "
        "section)"
    ]
    assert problems_of(make_inventory(group_vars={**ONE_MODEL, "gpufleet_services": ["qwen"]})) == [
        "gpufleet_services[0]: gpufleet_services: found 'qwen'; expected a mapping (name, model, replicas, "
        "...). Fix: write each service as a mapping"
    ]


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "edge"), [("n", False), ("off", False), (False, False), ("yes", True), ("on", True)]
)
def test_the_edge_is_read_from_gateway_edge_as_the_gateway_role_reads_it(
    value: object, edge: bool, tmp_path: Path
) -> None:
    """The load and the report measure the edge only where the gateway role runs one: ``gateway_edge`` is an
    Ansible boolean there (argument spec type bool: "n" and "off" are false, "on" is true)."""
    inventory = tmp_path / "prod"
    shutil.copytree(REPO / "inventories" / "prod", inventory)
    hosts = inventory / "hosts.yml"
    data = yaml.safe_load(hosts.read_text(encoding="utf-8"))
    head = data["gpu_nodes"]["children"]["ray_head"]["hosts"]
    for host in head.values():
        host["gateway_edge"] = value
    hosts.write_text(yaml.safe_dump(data), encoding="utf-8")

    fleet = load(inventory)

    assert (fleet.edge is not None) == edge, fleet.edge


def test_a_services_own_image_is_validated_and_judged_against_the_fleets_gpus(
    make_inventory: InventoryFactory,
) -> None:
    """``image`` of a service (its replicas run it, each in its own container) is a Docker reference, and
    it is judged as the fleet's image is: an image whose CUDA the driver cannot run is refused naming the
    service, before any host is touched."""
    said = problems_of(with_services(make_inventory, service("a", image="Not An Image")))
    assert said == [
        "gpufleet_services[0] (a): image: found 'Not An Image'; expected a Docker image reference such as "
        "vllm/vllm-openai:v0.24.0 (name[:tag][@sha256:digest]). Fix: set image to a valid value"
    ], said
    fine = with_services(make_inventory, service("a", image="vllm/vllm-openai:v0.24.0"))
    assert problems_of(fine) == []
    new = with_services(
        make_inventory, service("a", image="vllm/vllm-openai:v0.24.0"), nvidia_driver_version="535.183.01"
    )
    said = problems_of(new)
    assert any(
        line.startswith("gpufleet_services (a): image: found vllm/vllm-openai:v0.24.0") for line in said
    ), said
    spec = load(fine).spec
    assert spec is not None and [s.image for s in spec.services] == ["vllm/vllm-openai:v0.24.0"]
