"""A P/D service (issue 39): one model of the fleet whose replicas have roles, prefill and decode, each placed
and planned per role, each replica with its KV connector and side channel, its router in P/D mode."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpufleet.fleet.schema import ServiceSpec
from gpufleet.planner.placement import Node, PlacementError, Shape, place
from tests.unit.test_placement_lookup import REPO, lookup

MODEL = {"repo": "Qwen/Qwen2.5-1.5B-Instruct", "dir": "/opt/models/qwen"}


def service(**more: Any) -> ServiceSpec:
    return ServiceSpec.model_validate({"name": "qwen", "model": MODEL, **more})


def test_a_role_overlays_the_services_settings_and_shares_its_kv_layout() -> None:
    spec = service(
        serving={"block_size": 128, "max_num_seqs": 64},
        pd={"prefill": {"serving": {"tensor_parallel_size": 2}}, "decode": {"replicas": 2}},
    )
    prefill, decode = spec.serving_of("prefill"), spec.serving_of("decode")
    assert (prefill.tensor_parallel_size, prefill.block_size, prefill.max_num_seqs) == (2, 128, 64)
    assert (decode.tensor_parallel_size, decode.block_size) == (1, 128)
    assert spec.serving_of(None) == spec.serving


@pytest.mark.parametrize("shared", ["block_size", "kv_cache_dtype", "dtype", "max_model_len"])
def test_a_setting_both_roles_share_is_refused_on_a_role(shared: str) -> None:
    value = {"block_size": 32, "kv_cache_dtype": "fp8", "dtype": "half", "max_model_len": 4096}[shared]
    with pytest.raises(ValidationError, match=f"{shared} on the service's serving, not on a role"):
        service(pd={"decode": {"serving": {shared: value}}})


@pytest.mark.parametrize("beside", [{"replicas": 2}, {"hosts": ["gpu1"]}])
def test_replicas_or_hosts_beside_pd_are_refused(beside: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="beside pd: a P/D service sets them per role"):
        service(pd={}, **beside)


def test_only_the_nixl_connector_is_taken() -> None:
    with pytest.raises(ValidationError, match="NixlConnector"):
        service(pd={"connector": "P2pNcclConnector"})


def test_each_role_is_placed_as_its_own_shape_with_its_ids_ports_and_side_channels() -> None:
    nodes = [Node("gpu1", 4), Node("gpu2", 4)]
    shapes = [
        Shape("qwen", tensor_parallel_size=2, role="prefill", side_channel_port=5600),
        Shape("qwen", tensor_parallel_size=1, replicas=3, role="decode", side_channel_port=5600),
    ]
    placed = {
        r.id: (r.role, r.node, r.members[0].gpus, r.port, r.side_channel_port)
        for r in place(nodes, shapes).replicas
    }
    assert placed == {
        "qwen-p0": ("prefill", "gpu1", (0, 1), 8100, 5600),  # TP 2: side channels 5600 and 5601
        # decode spreads over the nodes (its own replicas), then fills the one with the fewest GPUs left
        "qwen-d0": ("decode", "gpu1", (2,), 8101, 5602),  # the first side channel after the prefill's two
        "qwen-d1": ("decode", "gpu2", (0,), 8100, 5600),
        "qwen-d2": ("decode", "gpu1", (3,), 8102, 5603),
    }


def test_a_role_that_does_not_fit_is_named() -> None:
    with pytest.raises(PlacementError, match=r"service qwen \(decode\)"):
        place(
            [Node("gpu1", 1)],
            [
                Shape("qwen", role="prefill", side_channel_port=5600),
                Shape("qwen", role="decode", side_channel_port=5600),
            ],
        )


@pytest.fixture
def pd_inventory(tmp_path: Path) -> Path:
    """inventories/prod with its service as 1 prefill (the 3090 head) and 1 decode (the H800 worker)."""
    inventory = tmp_path / "pd"
    shutil.copytree(REPO / "inventories/prod", inventory)
    variables = inventory / "group_vars/gpu_nodes.yml"
    values = yaml.safe_load(variables.read_text(encoding="utf-8"))
    qwen = values["gpufleet_services"][0]
    del qwen["replicas"]
    qwen["model"]["config"] = str(REPO / "models/Qwen2.5-1.5B-Instruct/config.json")
    qwen["serving"]["block_size"] = 128
    qwen["pd"] = {
        "prefill": {"hosts": ["ray_head"]},
        "decode": {"hosts": ["gpu-worker-01"], "serving": {"max_num_seqs": 64}},
    }
    variables.write_text(yaml.safe_dump(values), encoding="utf-8")
    return inventory


def test_the_lookup_gives_each_replica_its_role_connector_and_side_channel(pd_inventory: Path) -> None:
    replicas = {r["id"]: r for r in lookup("replicas", pd_inventory)}
    assert sorted(replicas) == ["qwen-d0", "qwen-p0"]
    prefill, decode = replicas["qwen-p0"], replicas["qwen-d0"]
    assert (prefill["role"], prefill["node"], decode["role"], decode["node"]) == (
        "prefill",
        "gpu-head-01",
        "decode",
        "gpu-worker-01",
    )
    assert prefill["kv_transfer_config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert decode["kv_transfer_config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    assert decode["env"] == {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.10.0.11",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
        # UCX turns cuda_ipc's GET zero-copy off without NVLink: the KV cache would go through TCP
        "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y",
    }
    # the role's settings overlay the service's; the KV layout is the service's
    assert decode["serving"]["max_num_seqs"] == 64 and prefill["serving"]["max_num_seqs"] is None
    assert prefill["serving"]["block_size"] == decode["serving"]["block_size"] == 128


def test_the_gateway_puts_a_pd_service_behind_a_router_in_pd_mode(pd_inventory: Path) -> None:
    (router,) = lookup("gateway", pd_inventory)
    assert router["workers"] == ["http://10.10.0.10:8100", "http://10.10.0.11:8100"]
    assert router["pd"] == {"prefill": ["http://10.10.0.10:8100"], "decode": ["http://10.10.0.11:8100"]}
    metrics = [m for m in lookup("metrics", pd_inventory) if m["job"] == "vllm"]
    assert [(m["labels"]["replica"], m["labels"]["role"]) for m in metrics] == [
        ("qwen-p0", "prefill"),
        ("qwen-d0", "decode"),
    ]


def test_kv_transfer_off_gives_no_connector_and_no_environment(pd_inventory: Path) -> None:
    variables = pd_inventory / "group_vars/gpu_nodes.yml"
    values = yaml.safe_load(variables.read_text(encoding="utf-8"))
    values["gpufleet_services"][0]["pd"]["kv_transfer"] = False
    variables.write_text(yaml.safe_dump(values), encoding="utf-8")
    for replica in lookup("replicas", pd_inventory):
        assert (replica["kv_transfer_config"], replica["env"]) == (None, {}), replica["id"]


def test_a_service_without_roles_keeps_its_entries() -> None:
    for replica in lookup("replicas", REPO / "inventories/prod"):
        assert (replica["role"], replica["kv_transfer_config"], replica["env"]) == (None, None, {})
    assert all("pd" not in router for router in lookup("gateway", REPO / "inventories/prod"))


def set_pd(inventory: Path, **changes: Any) -> None:
    variables = inventory / "group_vars/gpu_nodes.yml"
    values = yaml.safe_load(variables.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if key == "block_size":
            values["gpufleet_services"][0]["serving"]["block_size"] = value
        elif key == "ray_cluster_image":
            values["ray_cluster_image"] = value
        else:
            values["gpufleet_services"][0]["pd"][key] = value
    variables.write_text(yaml.safe_dump(values), encoding="utf-8")


def test_a_pd_service_of_the_prod_fleet_is_valid_and_planned_per_role(pd_inventory: Path) -> None:
    from gpufleet.fleet.loaded import load

    fleet = load(pd_inventory)
    assert fleet.spec is not None and not fleet.problems, fleet.problems
    assert not [w for w in fleet.warnings if "pd" in w], fleet.warnings  # NIXL in vllm/vllm-openai, block 128


def test_block_16_on_pd_is_warned(pd_inventory: Path) -> None:
    from gpufleet.fleet.loaded import load

    set_pd(pd_inventory, block_size=16)
    fleet = load(pd_inventory)
    assert fleet.spec is not None, fleet.problems
    assert any("serving.block_size 16 with pd" in warning for warning in fleet.warnings), fleet.warnings


def test_the_labs_cpu_image_is_refused_with_kv_transfer_on_and_warned_with_it_off(pd_inventory: Path) -> None:
    from gpufleet.fleet.loaded import load

    set_pd(pd_inventory, ray_cluster_image="gpufleet/vllm-cpu:0.32.0")
    refused = load(pd_inventory)
    assert [(p.where, p.variable) for p in refused.problems] == [
        ("gpufleet_services: service qwen", "ray_cluster_image / pd.kv_transfer")
    ], refused.problems
    assert "set pd.kv_transfer: false" in str(refused.problems[0])
    set_pd(pd_inventory, kv_transfer=False)
    allowed = load(pd_inventory)
    assert allowed.spec is not None and not allowed.problems, allowed.problems
    assert any("KV transfer is OFF (test only)" in warning for warning in allowed.warnings), allowed.warnings
