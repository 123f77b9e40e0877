"""The lookup gpufleet_placement's `metrics` term: what the monitoring stage scrapes of a services inventory
(each replica's vLLM where its router reaches it, each router's metrics port on the gateway host)."""

from __future__ import annotations

from pathlib import Path

from .test_placement_lookup import REPO, lookup


def test_every_replica_and_every_router_is_a_scrape_target_with_its_labels() -> None:
    targets = lookup("metrics", REPO / "inventories/prod")
    assert targets == [
        {"job": "vllm", "target": "10.10.0.10:8100",
         "labels": {"node": "gpu-head-01", "service": "qwen", "replica": "qwen-0"}},
        {"job": "vllm", "target": "10.10.0.11:8100",
         "labels": {"node": "gpu-worker-01", "service": "qwen", "replica": "qwen-1"}},
        {"job": "router", "target": "127.0.0.1:29200", "labels": {"service": "qwen"}},
    ]  # fmt: skip
    moved = lookup("metrics", REPO / "inventories/prod", gateway_host="10.0.0.9", first_metrics_port=30000)
    assert moved[-1]["target"] == "10.0.0.9:30000"


def test_the_edges_exporter_is_a_target_when_its_port_is_given() -> None:
    targets = lookup("metrics", REPO / "inventories/prod", gateway_host="10.0.0.9", edge_metrics_port=29199)
    assert targets[-1] == {"job": "edge", "target": "10.0.0.9:29199", "labels": {}}
    assert [t["job"] for t in targets] == ["vllm", "vllm", "router", "edge"]


def test_an_inventory_without_services_has_nothing_more_to_scrape(tmp_path: Path) -> None:
    one_model = REPO / "inventories/examples/tp-across-nodes"
    assert lookup("metrics", one_model if one_model.exists() else REPO / "inventories/lab") == []
