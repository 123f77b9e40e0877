"""playbooks/teardown.yml stops every vLLM instance unit (gpufleet-vllm@<id>), and only stops (never disables)
one whose file is gone: its loop and conditions, evaluated by Ansible's own templating on a node's
service_facts. (The lab's teardown test runs after a rollback to the layout before instances, where no
instance unit runs: an instance pattern that matched nothing passed it.)"""

from __future__ import annotations

from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from .conftest import REPO

SERVICES = {
    "gpufleet-vllm@default.service": {"state": "running", "status": "active"},
    "gpufleet-vllm@qwen-7b.service": {"state": "stopped", "status": "failed"},
    "gpufleet-vllm.service": {"state": "stopped", "status": "disabled"},
    "ssh.service": {"state": "running", "status": "enabled"},
}


def stop_task() -> dict[str, Any]:
    (play, *_) = yaml.safe_load((REPO / "playbooks" / "teardown.yml").read_text(encoding="utf-8"))
    (task,) = [t for t in play["tasks"] if "every vLLM instance" in t.get("name", "")]
    return dict(task)


def evaluate(expression: str, template_exists: bool, **more: Any) -> Any:
    variables = {
        "ansible_facts": {"services": SERVICES},
        "__teardown_vllm_template": {"stat": {"exists": template_exists}},
        **more,
    }
    task = stop_task()
    for name, value in task.get("vars", {}).items():
        variables[name] = trust_as_template(value)
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template(expression))


def test_every_instance_unit_is_in_the_loop() -> None:
    items = evaluate(stop_task()["loop"], template_exists=True)

    assert items == [
        "gpufleet-vllm@default.service",
        "gpufleet-vllm@qwen-7b.service",
        "gpufleet-vllm.service",
    ]


def test_an_instance_is_stopped_and_disabled_while_its_template_is_there() -> None:
    task = stop_task()
    when = "{{ " + task["when"] + " }}"
    enabled = task["ansible.builtin.systemd_service"]["enabled"]
    for unit in ("gpufleet-vllm@default.service", "gpufleet-vllm@qwen-7b.service"):
        assert evaluate(when, template_exists=True, item=unit) is True
        assert evaluate(enabled, template_exists=True, item=unit, omit="OMIT") is False


def test_an_instance_whose_files_are_gone_is_only_stopped_and_only_while_it_runs() -> None:
    task = stop_task()
    when = "{{ " + task["when"] + " }}"
    enabled = task["ansible.builtin.systemd_service"]["enabled"]
    assert evaluate(when, template_exists=False, item="gpufleet-vllm@default.service") is True
    unit = "gpufleet-vllm@default.service"
    assert evaluate(enabled, template_exists=False, item=unit, omit="OMIT") == "OMIT"
    assert evaluate(when, template_exists=False, item="gpufleet-vllm@qwen-7b.service") is False


def test_the_gateway_stops_first_and_a_haproxy_of_the_hosts_own_is_left() -> None:
    """The edge (HAProxy with gpufleet's key map) and every router stop before any vLLM; a HAProxy without
    the key map is the host's own and stays."""
    (play, *_) = yaml.safe_load((REPO / "playbooks" / "teardown.yml").read_text(encoding="utf-8"))
    names = [t.get("name", "") for t in play["tasks"]]
    (task,) = [t for t in play["tasks"] if t.get("name", "").startswith("Stop and disable the gateway")]
    assert names.index(task["name"]) < names.index(stop_task()["name"])
    services = SERVICES | {
        "gpufleet-router@tiny.service": {"state": "running", "status": "enabled"},
        "gpufleet-router@chat.service": {"state": "stopped", "status": "enabled"},
        "haproxy.service": {"state": "running", "status": "enabled"},
    }

    def loop(edge: bool) -> Any:
        variables = {"ansible_facts": {"services": services}, "__teardown_edge": {"stat": {"exists": edge}}}
        templar = Templar(loader=DataLoader(), variables=variables)
        return templar.template(trust_as_template(task["loop"]))

    routers = ["gpufleet-router@chat.service", "gpufleet-router@tiny.service"]
    assert loop(edge=True) == ["haproxy.service", *routers]
    assert loop(edge=False) == routers
