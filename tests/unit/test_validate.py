"""Inventory validation: each problem a user can cause gives one line naming where, what and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli import main
from gpufleet.fleet import load, load_fleet, plan_request_for_inventory, validate_inventory
from gpufleet.problems import InventoryError

from .conftest import PROD_INVENTORY, TP_INVENTORY, InventoryFactory, head_vars, worker_vars


def problems_of(path: Path) -> list[str]:
    return [str(problem) for problem in validate_inventory(path).problems]


def only_problem(path: Path) -> str:
    problems = problems_of(path)
    assert len(problems) == 1, problems
    return problems[0]


@pytest.mark.parametrize("inventory", [PROD_INVENTORY, TP_INVENTORY], ids=["prod", "tp-across-nodes"])
def test_prod_inventory_and_the_tp_example_are_valid(inventory: Path) -> None:
    result = validate_inventory(inventory)
    assert result.problems == []
    assert result.fleet is not None
    assert [node.name for node in result.fleet.nodes] == ["gpu-head-01", "gpu-worker-01"]
    assert result.fleet.head.name == "gpu-head-01"


def test_the_tp_example_warns_about_mixed_gpus_and_cross_node_tensor_parallelism() -> None:
    warnings = " ".join(validate_inventory(TP_INVENTORY).warnings)
    assert "RTX 3090" in warnings
    assert "tensor parallelism spans nodes" in warnings


def test_prod_has_nothing_to_warn_about_with_a_replica_on_each_gpu() -> None:
    """Each replica stays on its own GPU: no all-reduce over the network, no 3090 sizing the H800."""
    assert validate_inventory(PROD_INVENTORY).warnings == []


def test_loader_applies_ansible_precedence(make_inventory: InventoryFactory) -> None:
    def host_override(hosts: dict[str, Any]) -> None:
        head_vars(hosts)["gpufleet_nic"] = "ens1f0"

    fleet = load_fleet(make_inventory(host_override, group_vars={"gpufleet_nic": "eth9"}))
    assert fleet.head.nic == "ens1f0"  # host vars win over group_vars
    assert fleet.workers[0].nic == "eth0"


def test_loader_renders_templates(make_inventory: InventoryFactory) -> None:
    path = make_inventory(group_vars={"models_root": "/srv/m", "gpufleet_model_dir": "{{ models_root }}/q"})
    assert load_fleet(path).model.dir == "/srv/m/q"


def test_no_head(make_inventory: InventoryFactory) -> None:
    def no_head(hosts: dict[str, Any]) -> None:
        hosts["gpu_nodes"]["children"]["ray_head"]["hosts"] = {}

    line = problems_of(make_inventory(no_head))[0]
    assert line.startswith("group ray_head: hosts: found no host; expected exactly one host")
    assert "Fix:" in line


def test_several_heads(make_inventory: InventoryFactory) -> None:
    def two_heads(hosts: dict[str, Any]) -> None:
        hosts["gpu_nodes"]["children"]["ray_head"]["hosts"]["worker"] = worker_vars(hosts)
        del hosts["gpu_nodes"]["children"]["ray_workers"]

    line = only_problem(make_inventory(two_heads))
    assert "found 2 hosts (head, worker)" in line
    assert "ray_workers" in line


def test_the_control_group_names_at_most_one_host(make_inventory: InventoryFactory) -> None:
    """Issue 34 step 6: gpufleet_control (what runs once per fleet) is optional; the Ray head stands in."""
    assert load(make_inventory()).control == "head"

    def one_gateway(hosts: dict[str, Any]) -> None:
        hosts["gpufleet_control"] = {"hosts": {"gateway": {"ansible_host": "10.0.0.9"}}}

    fleet = load(make_inventory(one_gateway))
    assert fleet.problems == () and fleet.control == "gateway"  # any host: the gateway may have no GPU

    def two(hosts: dict[str, Any]) -> None:
        hosts["gpufleet_control"] = {"hosts": {"gateway": {}, "head": {}}}

    line = only_problem(make_inventory(two))
    assert line == (
        "group gpufleet_control: hosts: found 2 hosts (gateway, head); expected one host (what runs once "
        "per fleet: the run marker), or no such group (the Ray head is used). "
        "Fix: keep one host in gpufleet_control"
    )


def test_duplicate_host_name_in_yaml(make_inventory: InventoryFactory) -> None:
    text = """
gpu_nodes:
  children:
    ray_head:
      hosts:
        head: {ansible_host: 192.0.2.10, gpufleet_node_ip: 10.10.0.10, gpufleet_nic: eth0,
               gpufleet_gpu_model: NVIDIA H100 80GB HBM3}
    ray_workers:
      hosts:
        worker: {ansible_host: 192.0.2.11, gpufleet_node_ip: 10.10.0.11, gpufleet_nic: eth0,
                 gpufleet_gpu_model: NVIDIA H100 80GB HBM3}
        worker: {ansible_host: 192.0.2.12, gpufleet_node_ip: 10.10.0.12, gpufleet_nic: eth0,
                 gpufleet_gpu_model: NVIDIA H100 80GB HBM3}
"""
    line = problems_of(make_inventory(hosts_text=text))[0]
    assert "hosts.yml:12: worker: found defined twice" in line


def test_duplicate_node_ip(make_inventory: InventoryFactory) -> None:
    def same_ip(hosts: dict[str, Any]) -> None:
        worker_vars(hosts)["gpufleet_node_ip"] = "10.10.0.10"

    line = only_problem(make_inventory(same_ip))
    assert line.startswith("hosts head and worker: gpufleet_node_ip: found 10.10.0.10 on both")


def test_duplicate_ansible_host(make_inventory: InventoryFactory) -> None:
    def same_machine(hosts: dict[str, Any]) -> None:
        worker_vars(hosts)["ansible_host"] = "192.0.2.10"

    assert "ansible_host: found 192.0.2.10 on both" in only_problem(make_inventory(same_machine))


@pytest.mark.parametrize("address", ["10.10.0.300", "not-an-ip", "10.10.0"])
def test_invalid_node_ip(make_inventory: InventoryFactory, address: str) -> None:
    def bad_ip(hosts: dict[str, Any]) -> None:
        worker_vars(hosts)["gpufleet_node_ip"] = address

    line = only_problem(make_inventory(bad_ip))
    assert line.startswith(f"host worker: gpufleet_node_ip: found '{address}'; expected")
    assert "IPv4" in line


def test_missing_nic(make_inventory: InventoryFactory) -> None:
    def no_nic(hosts: dict[str, Any]) -> None:
        del head_vars(hosts)["gpufleet_nic"]

    line = only_problem(make_inventory(no_nic))
    assert line.startswith("host head: gpufleet_nic: found nothing (the variable is not set)")


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("gpufleet_node_iq", "gpufleet_node_ip"),
        ("vllm_service_tensor_paralel_size", "vllm_service_tensor_parallel_size"),
        ("gpu_memory_utilization", "vllm_service_gpu_memory_utilization"),
    ],
)
def test_unknown_variable_suggests_the_known_one(
    make_inventory: InventoryFactory, typo: str, suggestion: str
) -> None:
    def add_typo(hosts: dict[str, Any]) -> None:
        head_vars(hosts)[typo] = 1

    line = only_problem(make_inventory(add_typo))
    assert line.startswith(f"host head: {typo}: found a variable gpufleet does not know")
    assert f"did you mean {suggestion}?" in line


def test_users_own_variables_are_left_alone(make_inventory: InventoryFactory) -> None:
    path = make_inventory(group_vars={"rack": "b12", "ntp_servers": ["10.0.0.1"]})
    assert problems_of(path) == []


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("vllm_service_gpu_memory_utilization", 0, "greater than 0"),
        ("vllm_service_gpu_memory_utilization", 1.5, "less than or equal to 1"),
        ("vllm_service_max_model_len", -5, "greater than 0"),
        ("vllm_service_port", 70000, "less than or equal to 65535"),
        ("vllm_service_block_size", 24, "16"),
        ("vllm_service_dtype", "bf16", "'bfloat16'"),
        ("gpufleet_model_dir", "models/q", "absolute path"),
        ("gpufleet_model_repo", "just-a-name", "pattern"),
    ],
)
def test_values_out_of_range(
    make_inventory: InventoryFactory, variable: str, value: Any, expected: str
) -> None:
    line = only_problem(make_inventory(group_vars={variable: value}))
    assert line.startswith(f"group gpu_nodes: {variable}: found {value!r}; expected")
    assert expected in line
    assert f"Fix: set {variable}" in line


@pytest.mark.parametrize("value", [123, ["/srv/bundle"], {"dir": "/srv/bundle"}])
def test_a_bundle_dir_that_is_not_a_path_is_a_problem(make_inventory: InventoryFactory, value: Any) -> None:
    line = only_problem(make_inventory(group_vars={"gpufleet_bundle_dir": value}))
    assert line.startswith(f"group gpu_nodes: gpufleet_bundle_dir: found {value!r}; expected")
    assert "Fix: " in line


def test_parallelism_must_match_declared_gpus(make_inventory: InventoryFactory) -> None:
    path = make_inventory(group_vars={"vllm_service_tensor_parallel_size": 4})
    line = only_problem(path)
    assert "found 4 x 2 = 8 GPUs; expected the 2 GPUs the inventory declares (head: 1, worker: 1)" in line


def test_version_skew_between_nodes(make_inventory: InventoryFactory) -> None:
    def skew(hosts: dict[str, Any]) -> None:
        worker_vars(hosts)["vllm_service_max_model_len"] = 2048

    line = only_problem(make_inventory(skew))
    assert line.startswith("group gpu_nodes: vllm_service_max_model_len: found 4096 on head, 2048 on worker")


def test_planner_rejection_is_a_problem(make_inventory: InventoryFactory) -> None:
    line = only_problem(make_inventory(group_vars={"vllm_service_max_model_len": 200000}))
    assert "vllm_service_* (planner)" in line
    assert "200000" in line


def test_unknown_gpu_model_needs_memory(make_inventory: InventoryFactory) -> None:
    def unknown(hosts: dict[str, Any]) -> None:
        head_vars(hosts)["gpufleet_gpu_model"] = "Imaginary GPU 9000"

    line = only_problem(make_inventory(unknown))
    assert line.startswith("host head: gpufleet_gpu_memory_gib:")


def test_template_error_is_a_problem(make_inventory: InventoryFactory) -> None:
    line = only_problem(make_inventory(group_vars={"gpufleet_model_dir": "{{ undefined_thing }}/q"}))
    assert "gpufleet_model_dir" in line
    assert "undefined_thing" in line


def test_missing_inventory_path(tmp_path: Path) -> None:
    line = only_problem(tmp_path / "nope")
    assert "no such file or directory" in line


def test_unparsable_inventory(tmp_path: Path) -> None:
    broken = tmp_path / "hosts.yml"
    broken.write_text("gpu_nodes: [unclosed\n", encoding="utf-8")
    line = only_problem(broken)
    assert line.startswith(f"{broken}:2: -i: found YAML it cannot read (while parsing a flow sequence")
    assert "; expected YAML: `name: value` lines" in line and ". Fix: correct the line" in line


def test_plan_request_for_inventory_uses_the_smallest_gpu() -> None:
    request = plan_request_for_inventory(TP_INVENTORY)
    assert [gpu.memory_gib for gpu in request.gpus] == [23.69, 79.18]
    assert request.tensor_parallel_size == 2


def test_the_inventorys_multimodal_limits_reach_the_planner(make_inventory: InventoryFactory) -> None:
    """vllm_service_limit_mm_per_prompt as vLLM takes it (a count, or {count: N} per modality): the plan of
    the inventory counts the vision tower as the CLI's --limit-mm-per-prompt does (issue 38)."""
    limits = {"vllm_service_limit_mm_per_prompt": {"image": 0, "video": {"count": 0}}}
    request = plan_request_for_inventory(make_inventory(group_vars=limits))
    assert request.limit_mm_per_prompt == {"image": 0, "video": 0}

    line = only_problem(make_inventory(group_vars={"vllm_service_limit_mm_per_prompt": {"image": -1}}))
    assert "vllm_service_limit_mm_per_prompt" in line and "found -1" in line, line


def test_load_fleet_raises_with_every_problem(make_inventory: InventoryFactory) -> None:
    path = make_inventory(group_vars={"vllm_service_port": 0, "vllm_service_block_size": 3})
    with pytest.raises(InventoryError) as raised:
        load_fleet(path)
    assert len(str(raised.value).splitlines()) == 2


def test_cli_valid_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-i", str(TP_INVENTORY)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{TP_INVENTORY}: valid — 2 node(s), head gpu-head-01, 2 GPU(s), model Qwen/Qwen2.5-1.5B-Instruct"
    ]


def test_cli_valid_says_each_service_with_its_model_and_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    """A services inventory serves no one model: the line names each service and the replicas placed."""
    assert main(["validate", "-i", str(PROD_INVENTORY)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{PROD_INVENTORY}: valid — 2 node(s), head gpu-head-01, 2 GPU(s), 1 service(s): "
        "qwen (Qwen/Qwen2.5-1.5B-Instruct) as 2 replica(s) of 1 GPU(s), replicas: auto"
    ]


def test_cli_invalid_exit_one_without_traceback(
    make_inventory: InventoryFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_inventory(group_vars={"vllm_service_port": -1})
    assert main(["validate", "-i", str(path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "vllm_service_port: found -1" in err


def test_cli_json(make_inventory: InventoryFactory, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_inventory(group_vars={"vllm_service_port": -1})
    assert main(["validate", "-i", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert len(report["problems"]) == 1
