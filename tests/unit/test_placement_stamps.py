"""The lookup gpufleet_placement's `stamps` term: the converged stamps a services inventory leaves on a node,
for the whole deploy's fast path (playbooks/vars/fleet.yml). They must be named exactly as the roles name them
(model_fetch's ``__model_fetch_stamp``, vllm_service's ``__vllm_service_stamp``): a name that differs is a
stamp the fleet check never finds, and a services fleet never takes the fast path."""

from __future__ import annotations

from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from .test_placement_lookup import REPO, lookup

MODEL_DIR = "/opt/models/Qwen2.5-1.5B-Instruct"  # inventories/prod's one model


def role_var(role: str, name: str, **variables: Any) -> str:
    values = yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text(encoding="utf-8"))
    trusted = {key: trust_as_template(v) if isinstance(v, str) else v for key, v in values.items()}
    everything = trusted | variables
    templar = Templar(loader=DataLoader(), variables=everything)
    return str(templar.template(trust_as_template(values[name])))


def test_each_node_has_the_models_stamp_and_its_own_replicas_stamps_as_the_roles_name_them() -> None:
    fetched = role_var(
        "model_fetch", "__model_fetch_stamp", gpufleet_services=[], gpufleet_model_dir=MODEL_DIR
    )
    for node, replica in (("gpu-head-01", "qwen-0"), ("gpu-worker-01", "qwen-1")):
        served = role_var("vllm_service", "__vllm_service_stamp", vllm_service_instance_id=replica)
        assert lookup("stamps", REPO / "inventories/prod", node=node) == [fetched, served]
    assert fetched.startswith("model_fetch@") and served == "vllm_service@qwen-1"


def test_a_node_without_replicas_has_only_the_models_stamps() -> None:
    assert [s.split("@")[0] for s in lookup("stamps", REPO / "inventories/prod", node="elsewhere")] == [
        "model_fetch"
    ]
