"""Prefill/decode disaggregation without hosts: the vllm_pd role's files rendered for a 1P1D and a 1P2D
inventory, validation's refusals (src/gpufleet/fleet/disagg.py), the proxy's request rewriting and key check
(roles/vllm_pd/files/pd_proxy.py, its plain-Python part) and the runner's choice of the serve playbook.
The proxy's HTTP routing against real vLLM instances is tests/integration/test_pd.py (lab)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from gpufleet.compat import image_facts
from gpufleet.fleet.disagg import check_disagg
from gpufleet.fleet.inventory import read_inventory
from gpufleet.fleet.validate import validate_inventory
from gpufleet.runner import deploy_specs

from .conftest import REPO
from .test_vllm_service_templates import trusted

ROLE = REPO / "roles" / "vllm_pd"
EXAMPLE = REPO / "inventories" / "examples" / "pd"
KEY = "Pd7" * 21 + "x"


def proxy_module() -> Any:
    spec = importlib.util.spec_from_file_location("pd_proxy", ROLE / "files" / "pd_proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pd_proxy"] = module
    spec.loader.exec_module(module)
    return module


class PdRole:
    """The role's templates as one host of a fleet with ``decoders`` decode hosts sees them."""

    def __init__(self, host: str, decoders: int = 1, **overrides: Any) -> None:
        self.loader = DataLoader()
        self.variables: dict[str, Any] = {}
        for path in (ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml"):
            self.variables |= trusted(self.loader.load_from_file(str(path)))
        decode = [f"node{2 + i}" for i in range(decoders)]
        hosts = ["node1", *decode]
        hostvars = {name: {"gpufleet_node_ip": f"10.0.0.{1 + i}"} for i, name in enumerate(hosts)}
        self.variables |= {
            "inventory_hostname": host,
            "groups": {"ray_head": ["node1"], "vllm_prefill": ["node1"], "vllm_decode": decode},
            "hostvars": hostvars,
            "gpufleet_node_ip": hostvars[host]["gpufleet_node_ip"],
            "gpufleet_nic": "ens6f0",
            "gpufleet_model_dir": "/opt/models/tiny",
            "vllm_service_served_model_name": "tiny",
            "vllm_service_block_size": 32,
            "ansible_managed": "Ansible managed",
            "__vllm_pd_api_key": KEY,
        } | overrides

    def render(self, template: str) -> str:
        text = (ROLE / "templates" / template).read_text(encoding="utf-8")
        templar = Templar(loader=self.loader, variables=self.variables)
        rendered: str = templar.template(trust_as_template(text))
        return rendered

    def unit(self, template: str, kind: str) -> str:
        templar = Templar(loader=self.loader, variables=self.variables)
        unit = templar.template(trust_as_template("{{ __vllm_pd_units['" + kind + "'] }}"))
        self.variables["__vllm_pd_u"] = unit
        return self.render(template)


def instance_config(role: PdRole) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(role.render("vllm-pd.yaml.j2"))
    return loaded


def env_lines(role: PdRole) -> dict[str, str]:
    lines = [line for line in role.render("vllm-pd.env.j2").splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize("decoders", [1, 2])
def test_each_instance_gets_the_nixl_connector_on_its_own_address(decoders: int) -> None:
    for index, host in enumerate(["node1", *[f"node{2 + i}" for i in range(decoders)]]):
        role = PdRole(host, decoders)
        config = instance_config(role)
        assert config["host"] == f"10.0.0.{1 + index}"
        assert config["port"] == 8100
        assert config["block-size"] == 32
        assert json.loads(config["kv-transfer-config"]) == {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
        }
        env = env_lines(role)
        assert env["VLLM_API_KEY"] == KEY
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == f"10.0.0.{1 + index}"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
        assert env["UCX_NET_DEVICES"] == "ens6f0"
        assert KEY not in role.render("vllm-pd.yaml.j2")


def test_each_pool_has_its_own_tensor_parallel_size() -> None:
    assert instance_config(PdRole("node1", 2, vllm_pd_tensor_parallel_size=2))["tensor-parallel-size"] == 2
    assert instance_config(PdRole("node2", 2))["tensor-parallel-size"] == 1


@pytest.mark.parametrize("decoders", [1, 2])
def test_the_proxy_routes_to_every_instance_of_both_pools(decoders: int) -> None:
    routes = json.loads(PdRole("node1", decoders).render("pd-proxy.json.j2"))
    assert routes["port"] == 8000 and routes["host"] == "10.0.0.1" and routes["connector"] == "NixlConnector"
    assert [i["url"] for i in routes["prefill"]] == ["http://10.0.0.1:8100"]
    assert [i["url"] for i in routes["decode"]] == [f"http://10.0.0.{2 + i}:8100" for i in range(decoders)]
    assert KEY not in json.dumps(routes)
    assert PdRole("node1", decoders).render("pd-proxy.env.j2").strip().endswith(f"GPUFLEET_PD_API_KEY={KEY}")


def test_the_test_switch_renders_no_connector_and_says_so() -> None:
    role = PdRole("node2", 1, vllm_pd_test_only_no_kv_transfer=True)
    assert "kv-transfer-config" not in instance_config(role)
    assert "OFF" in role.render("vllm-pd.yaml.j2")
    assert not {"VLLM_NIXL_SIDE_CHANNEL_HOST", "UCX_NET_DEVICES"} & set(env_lines(role))
    assert (
        json.loads(PdRole("node1", 1, vllm_pd_test_only_no_kv_transfer=True).render("pd-proxy.json.j2"))[
            "connector"
        ]
        == "none"
    )


def test_p2p_nccl_makes_prefill_a_producer_and_decode_a_consumer() -> None:
    prefill = json.loads(
        instance_config(PdRole("node1", 1, vllm_pd_connector="P2pNcclConnector"))["kv-transfer-config"]
    )
    decode = json.loads(
        instance_config(PdRole("node2", 1, vllm_pd_connector="P2pNcclConnector"))["kv-transfer-config"]
    )
    assert (prefill["kv_role"], decode["kv_role"]) == ("kv_producer", "kv_consumer")
    assert prefill["kv_port"] == "21001"
    routes = json.loads(PdRole("node1", 1, vllm_pd_connector="P2pNcclConnector").render("pd-proxy.json.j2"))
    assert routes["decode"][0]["kv"] == "10.0.0.2:21001"


def test_units_start_the_instance_and_the_proxy_in_the_container() -> None:
    role = PdRole("node1", 1)
    ctl = role.unit("ctl.sh.j2", "instance")
    assert "vllm serve --config /etc/gpufleet/vllm-pd.yaml" in ctl and KEY not in ctl
    assert "--env-file /etc/gpufleet/vllm-pd.env" in ctl
    proxy = role.unit("ctl.sh.j2", "proxy")
    assert "python3 /etc/gpufleet/pd_proxy.py /etc/gpufleet/pd-proxy.json" in proxy
    assert "GPUFLEET_VLLM_PD=gpufleet-pd-proxy" in proxy
    unit = role.unit("unit.service.j2", "proxy")
    assert "ExecStart=/usr/local/libexec/gpufleet-pd-proxy start" in unit and "1P1D" in unit


# ----- validation ----------------------------------------------------------------------------------------


def inventory(tmp_path: Path, **group_vars: dict[str, Any]) -> Path:
    target = tmp_path / "pd"
    shutil.copytree(EXAMPLE, target)
    for group, values in group_vars.items():
        path = target / "group_vars" / f"{group}.yml"
        current = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
        path.write_text(yaml.safe_dump((current or {}) | values), encoding="utf-8")
    return target


def problems(path: Path) -> list[str]:
    return [str(problem) for problem in validate_inventory(path).problems]


def test_the_example_inventory_is_valid_and_warns_that_nixl_is_not_known() -> None:
    result = validate_inventory(EXAMPLE)
    assert result.problems == []
    assert any("NIXL" in warning and "not known" in warning for warning in result.warnings)


def test_a_decode_pool_with_another_block_size_is_refused(tmp_path: Path) -> None:
    found = problems(inventory(tmp_path, vllm_decode={"vllm_pd_config": {"block-size": 32}}))
    assert any("block-size" in p and "gpu2" in p and "prefill pool" in p for p in found), found


def test_a_decode_pool_with_another_kv_dtype_is_refused(tmp_path: Path) -> None:
    found = problems(inventory(tmp_path, vllm_decode={"vllm_pd_config": {"kv-cache-dtype": "fp8"}}))
    assert any("kv-cache-dtype" in p and "'fp8'" in p for p in found), found


def test_the_lab_image_is_refused_unless_kv_transfer_is_switched_off(tmp_path: Path) -> None:
    found = problems(inventory(tmp_path, gpu_nodes={"ray_cluster_image": "gpufleet/vllm-cpu:0.32.0"}))
    assert any("ray_cluster_image" in p and "CPU build" in p for p in found), found
    allowed = validate_inventory(
        inventory(
            tmp_path / "b",
            gpu_nodes={
                "ray_cluster_image": "gpufleet/vllm-cpu:0.32.0",
                "vllm_pd_test_only_no_kv_transfer": True,
            },
        )
    )
    assert allowed.problems == [] and any("KV transfer is OFF" in w for w in allowed.warnings)


def test_an_image_without_nixl_is_refused_for_nixl() -> None:
    raw = read_inventory(EXAMPLE)
    image = image_facts("vllm/vllm-openai:v0.10.1.1")
    assert image.has_nixl is None
    without = type(image)(image.reference, image.cuda, image.has_ray, has_nixl=False)
    found = [str(p) for p in check_disagg(raw, {}, REPO, image=without).problems]
    assert any("has no NIXL" in p for p in found), found
    assert (
        check_disagg(raw, {}, REPO, image=type(image)(image.reference, "12.8", True, has_nixl=True)).problems
        == []
    )


def test_ports_that_collide_are_refused(tmp_path: Path) -> None:
    found = problems(
        inventory(tmp_path, vllm_prefill={"vllm_pd_side_channel_port": 8101, "vllm_pd_port": 8102})
    )
    assert any("vllm_pd_side_channel_port" in p and "8102" in p and "gpu1" in p for p in found), found
    found = problems(inventory(tmp_path / "b", vllm_decode={"vllm_pd_port": 6380}))  # every node's raylet
    assert any("6380" in p and "ray_cluster_node_manager_port" in p and "gpu2" in p for p in found), found
    found = problems(inventory(tmp_path / "d", vllm_prefill={"vllm_pd_port": 6379}))  # the head's GCS
    assert any("6379" in p and "ray_cluster_port" in p and "gpu1" in p for p in found), found
    # Ray's GCS listens on the head only: a decode host (gpu2) may use 6379 (it was refused before)
    assert problems(inventory(tmp_path / "e", vllm_decode={"vllm_pd_port": 6379})) == []
    found = problems(inventory(tmp_path / "c", gpu_nodes={"vllm_pd_port": 8000}))
    assert any("vllm_pd_proxy_port" in p and "gpu1" in p for p in found), found


def test_an_empty_pool_and_a_host_in_both_pools_are_refused(tmp_path: Path) -> None:
    path = inventory(tmp_path)
    hosts = yaml.safe_load((path / "hosts.yml").read_text(encoding="utf-8"))
    children = hosts["all"]["children"]["gpu_nodes"]["children"]
    children["vllm_prefill"]["hosts"] = {"gpu2": None}
    (path / "hosts.yml").write_text(yaml.safe_dump(hosts), encoding="utf-8")
    assert any("in vllm_prefill and in vllm_decode" in p for p in problems(path))
    children["vllm_prefill"]["hosts"] = None
    (path / "hosts.yml").write_text(yaml.safe_dump(hosts), encoding="utf-8")
    assert any("group vllm_prefill" in p and "no host" in p for p in problems(path))


def test_a_pool_wider_than_its_hosts_is_refused(tmp_path: Path) -> None:
    found = problems(inventory(tmp_path, vllm_decode={"vllm_pd_tensor_parallel_size": 4}))
    assert any("vllm_pd_tensor_parallel_size" in p and "2 GPU" in p for p in found), found


def test_deploy_serves_prefill_decode_fleets_with_serve_pd(tmp_path: Path) -> None:
    stages = [spec.stage for spec in deploy_specs(EXAMPLE)]
    assert "serve_pd" in stages and "serve" not in stages and "verify" not in stages
    prod = [spec.stage for spec in deploy_specs(REPO / "inventories" / "prod")]
    assert prod[-3:] == ["serve", "verify", "monitoring"]  # prod turns the optional stage on


# ----- the proxy's plain-Python part --------------------------------------------------------------------


def test_the_prefill_request_is_one_token_not_streamed_and_keeps_the_kv_cache() -> None:
    proxy = proxy_module()
    body = {
        "model": "m",
        "prompt": "hi",
        "max_tokens": 50,
        "stream": True,
        "stream_options": {},
        "min_tokens": 3,
    }
    out = proxy.prefill_body(body, "NixlConnector")
    assert out["max_tokens"] == 1 and out["stream"] is False
    assert "stream_options" not in out and "min_tokens" not in out
    assert out["kv_transfer_params"]["do_remote_decode"] is True
    assert body["max_tokens"] == 50 and body["stream"] is True  # the client's request is left as it was
    assert "kv_transfer_params" not in proxy.prefill_body(body, "none")


def test_the_decode_request_carries_what_prefill_returned() -> None:
    proxy = proxy_module()
    params = {"remote_engine_id": "e1", "remote_block_ids": [1, 2], "remote_host": "10.0.0.1"}
    out = proxy.decode_body(
        {"prompt": "hi", "max_tokens": 50}, {"kv_transfer_params": params}, "NixlConnector"
    )
    assert out == {"prompt": "hi", "max_tokens": 50, "kv_transfer_params": params}
    assert "kv_transfer_params" not in proxy.decode_body(
        {"prompt": "hi"}, {"kv_transfer_params": params}, "none"
    )


def test_round_robin_key_check_and_p2p_request_id() -> None:
    proxy = proxy_module()
    pool = proxy.RoundRobin([{"name": "a"}, {"name": "b"}])
    assert [pool.take()["name"] for _ in range(5)] == ["a", "b", "a", "b", "a"]
    assert pool.sent == {"a": 3, "b": 2}
    assert proxy.authorized(f"Bearer {KEY}", KEY)
    assert not proxy.authorized(None, KEY) and not proxy.authorized(f"Bearer {KEY}x", KEY)
    assert not proxy.authorized(KEY, KEY) and not proxy.authorized("Bearer ", "")
    rid = proxy.request_id("P2pNcclConnector", {"kv": "10.0.0.1:21001"}, {"kv": "10.0.0.2:21001"})
    assert rid.startswith("___prefill_addr_10.0.0.1:21001___decode_addr_10.0.0.2:21001_")
