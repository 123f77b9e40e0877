"""`make demo` compares what each replica's vLLM reported at start-up with the lab's plan for its service
(gpufleet.lab.demo.compared_with_plans), as it compared the one instance before services, and `gpufleet
deploy` compares each replica with the plan for its own GPUs: a replica whose KV cache is more than 10% off
its plan is named in a warning, one that matches is not."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpufleet.commands.deploy import finished
from gpufleet.fleet import load
from gpufleet.fleet.services import plan_replicas
from gpufleet.lab.demo import compared_with_plans, lab_plan
from gpufleet.lab.inventory import DEMO_SERVICES, LabHost, LabInventory, services_inventory, write
from gpufleet.lab.tiny_model import TinyModelSpec, _config
from gpufleet.runner.report import DeployReport, ReplicaReport
from gpufleet.vllm_log import VllmFacts

from .conftest import PROD_INVENTORY, REPO


def lab(tmp_path: Path) -> tuple[Path, Path]:
    """The demo's services inventory over three lab hosts, and a bundle holding the tiny model's config."""
    lab_inventory = LabInventory(
        name="demo",
        hosts=tuple(LabHost(f"node{i}", f"10.0.0.{i}") for i in (1, 2, 3)),
        key=tmp_path / "key",
        inventory=tmp_path / "lab" / "hosts.yml",
        bridge_ip="10.0.0.254",
        subnet="10.0.0.0/24",
        offline=True,
    )
    write(lab_inventory)  # the lab's own hosts.yml, beside the lab's settings
    (tmp_path / "lab" / "group_vars").symlink_to(REPO / "inventories" / "lab" / "group_vars")
    inventory = services_inventory(lab_inventory.inventory, tmp_path / "services", DEMO_SERVICES)
    config = tmp_path / "bundle" / "models" / "gpufleet" / "tiny-qwen2" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(_config(TinyModelSpec(), pad_id=0, eos_id=0)), encoding="utf-8")
    return inventory, tmp_path / "bundle"


def test_each_replica_is_compared_with_its_services_plan(tmp_path: Path) -> None:
    inventory, bundle = lab(tmp_path)
    planned = lab_plan(inventory, bundle, "tiny")
    kv_gib = planned.kv_cache_gib_per_gpu
    shapes = (("tiny-0", "node1", 1.0), ("tiny-1", "node2", 1.2), ("tiny-chat-0", "node1", 1.0))
    replicas = [
        ReplicaReport(
            id=rid,
            service=rid.rsplit("-", 1)[0],
            node=node,
            url=f"http://{node}:8100",
            vllm=VllmFacts(kv_cache_gib=kv_gib * factor, kv_cache_tokens=planned.kv_cache_tokens),
        )
        for rid, node, factor in shapes
    ]

    report = compared_with_plans(DeployReport(ok=True, replicas=tuple(replicas)), inventory, bundle)

    assert [w.split(":")[0] for w in report.warnings] == ["replica tiny-1"], report.warnings
    assert "kv_cache_gib_per_gpu" in report.warnings[0] and "(+20%)" in report.warnings[0]


def test_gpufleet_deploy_compares_each_replica_with_its_own_plan() -> None:
    """`gpufleet deploy` of services (inventories/prod: qwen-0 on the RTX 3090, qwen-1 on the H800) compares
    each replica's vLLM with the plan for its own GPUs (gpufleet.fleet.services.plan_replicas): a replica
    whose KV cache is 20% off its plan is named, one that matches its own (different) plan is not."""
    fleet = load(PROD_INVENTORY).validate()
    assert fleet.spec is not None
    plans = plan_replicas(fleet.spec).plans
    assert sorted(plans) == ["qwen-0", "qwen-1"]
    assert plans["qwen-0"].kv_cache_tokens < plans["qwen-1"].kv_cache_tokens  # each on its own GPU
    replicas = [
        ReplicaReport(
            id=rid,
            service="qwen",
            node=node,
            url=f"http://{node}:8100",
            vllm=VllmFacts(
                kv_cache_gib=plans[rid].kv_cache_gib_per_gpu * factor,
                kv_cache_tokens=plans[rid].kv_cache_tokens,
            ),
        )
        for rid, node, factor in (("qwen-0", "gpu-a", 1.0), ("qwen-1", "gpu-b", 1.2))
    ]
    args = argparse.Namespace(extra_vars={}, bundle_signer=None, bundle=None)

    report = finished(DeployReport(ok=True, replicas=tuple(replicas)), fleet, args)

    compared = [w for w in report.warnings if w.startswith("replica ")]
    assert [w.split(":")[0] for w in compared] == ["replica qwen-1"], report.warnings
    assert "(+20%)" in compared[0]
