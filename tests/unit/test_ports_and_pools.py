"""Issue 37, class 3: a P/D service's roles and the monitoring settings get the single service's checks, and
ports are checked across everything one node runs (vLLM, Ray, monitoring, the relays, a P/D replica's NIXL
side channels), ports derived from a base port included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.fleet import validate_inventory

from .conftest import InventoryFactory, PdFactory


def problems(path: Path) -> list[str]:
    return [str(problem) for problem in validate_inventory(path).problems]


# One node's services wanting one port: (group_vars, the variable named, the other one named)
COLLISIONS: list[tuple[dict[str, Any], str, str]] = [
    ({"gpufleet_monitoring": True, "monitoring_node_exporter_port": 8000}, "vllm_service_port", "monitoring"),
    ({"gpufleet_monitoring": True, "monitoring_prometheus_port": 6379}, "monitoring_prometheus_port", "ray"),
    (
        {"gpufleet_monitoring": True, "monitoring_grafana": True, "monitoring_grafana_port": 9090},
        "monitoring_grafana_port",
        "monitoring_prometheus_port",
    ),
    (
        {"gpufleet_monitoring": True, "monitoring_dcgm_exporter_port": 6381},
        "monitoring_dcgm",
        "object_manager",
    ),
    ({"image_distribution_relay_port": 8000}, "vllm_service_port", "image_distribution_relay_port"),
    ({"model_fetch_relay_port": 6380}, "model_fetch_relay_port", "ray_cluster_node_manager_port"),
    (
        {"vllm_service_port": 10500},
        "vllm_service_port",
        "ray_cluster_min_worker_port",
    ),  # in Ray's worker range
    ({"vllm_service_port": 8265}, "vllm_service_port", "ray_cluster_dashboard_port"),
    ({"vllm_service_executor": "mp", "vllm_service_master_port": 8000}, "vllm_service_master_port", "vllm"),
    (
        {"ray_cluster_metrics_export_port": 9100, "gpufleet_monitoring": True},
        "node_exporter",
        "metrics_export",
    ),
]


@pytest.mark.parametrize(
    ("group_vars", "named", "other"), COLLISIONS, ids=[c[1] + "/" + c[2] for c in COLLISIONS]
)
def test_two_services_of_one_node_on_one_port_are_refused(
    make_inventory: InventoryFactory, group_vars: dict[str, Any], named: str, other: str
) -> None:
    found = [line for line in problems(make_inventory(group_vars=group_vars)) if "uses too" in line]

    assert found and all(named in line and other in line for line in found[:1]), found
    assert "a port of its own on each host" in found[0] and "Fix: give " in found[0]


# Accepted: services that never listen together, or not on that node
FREE: list[dict[str, Any]] = [
    {"image_distribution_relay_port": 18500, "model_fetch_relay_port": 18500},  # one after the other
    {"gpufleet_monitoring": False, "monitoring_node_exporter_port": 8000},  # monitoring is off
    {"vllm_service_master_port": 6379},  # the ray executor: no master port
    {"ray_cluster_start_ray": False, "vllm_service_port": 6380},  # no Ray on the nodes
    {"ray_cluster_min_worker_port": 20000, "ray_cluster_max_worker_port": 20999, "vllm_service_port": 10500},
]


@pytest.mark.parametrize("group_vars", FREE, ids=[",".join(f) for f in FREE])
def test_ports_that_never_meet_are_accepted(
    make_inventory: InventoryFactory, group_vars: dict[str, Any]
) -> None:
    assert [line for line in problems(make_inventory(group_vars=group_vars)) if "port" in line] == []


def test_ray_worker_ports_in_the_wrong_order_are_refused(make_inventory: InventoryFactory) -> None:
    path = make_inventory(
        group_vars={"ray_cluster_min_worker_port": 20000, "ray_cluster_max_worker_port": 19000}
    )
    (line,) = [line for line in problems(path) if "ray_cluster_min_worker_port" in line][:1]
    assert "above ray_cluster_max_worker_port (19000)" in line, line


def pd_roles(**roles: dict[str, Any]) -> Any:
    """An edit of the example's P/D service: ``pd`` keys, and each role's keys merged into its own."""

    def edit(service: dict[str, Any]) -> None:
        for key, value in roles.items():
            if key in ("prefill", "decode"):
                service["pd"][key] |= value
            else:
                service["pd"][key] = value

    return edit


# A P/D service's NIXL side channels: one port per replica and TP rank from pd.side_channel_port, on each node
@pytest.mark.parametrize(
    ("roles", "said"),
    [
        (
            {"side_channel_port": 65535, "prefill": {"serving": {"tensor_parallel_size": 2}}},
            "ports 65535-65536 for qwen-p0 on gpu1",
        ),
        ({"side_channel_port": 65535, "decode": {"replicas": 4}}, "port 65536 for qwen-d2 on gpu2"),
    ],
    ids=["tp-ranks", "replicas-on-one-node"],
)
def test_ports_derived_from_a_base_port_stay_in_range(
    pd_example: PdFactory, roles: dict[str, Any], said: str
) -> None:
    found = problems(pd_example(pd_roles(**roles), gpufleet_gpu_count=2))
    assert any(said in line and "one per replica and TP rank" in line for line in found), found


def test_a_side_channel_on_a_replicas_api_port_is_refused(pd_example: PdFactory) -> None:
    found = problems(pd_example(pd_roles(side_channel_port=8100)))
    assert any(
        "pd.side_channel_port: found port 8100 for qwen-p0 on gpu1, the API port of qwen-p0" in line
        for line in found
    ), found


@pytest.mark.parametrize(
    ("role", "key", "value"),
    [
        ("prefill", "gpu_memory_utilization", 90),
        ("prefill", "gpu_memory_utilization", "most"),
        ("decode", "max_num_seqs", -4),
        ("decode", "max_num_batched_tokens", "lots"),
        ("decode", "cpu_offload_gb", "some"),
        ("prefill", "quantization", "int3"),
    ],
    ids=str,
)
def test_a_roles_serving_settings_get_the_single_services_checks(
    pd_example: PdFactory, role: str, key: str, value: Any
) -> None:
    found = problems(pd_example(pd_roles(**{role: {"serving": {key: value}}})))
    assert any(f"pd.{role}.serving.{key}: found " in line for line in found), found
