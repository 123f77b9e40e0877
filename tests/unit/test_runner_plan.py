"""The runner in parts (issue 34): a deploy reads its inventory once, its stages are a run plan chosen with
Ansible's own booleans, and what the playbooks publish is read into one typed model."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.plugins.filter.core import to_bool
from rich.console import Console

from gpufleet.cli import main
from gpufleet.fleet import loaded
from gpufleet.runner import api
from gpufleet.runner.facts import PublishedFacts, as_bool
from gpufleet.runner.plan import RunPlan, Step, deploy_plan
from gpufleet.runner.progress import print_deploy_report
from gpufleet.runner.report import StageResult

from .conftest import InventoryFactory


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A one-node fleet whose endpoint is a closed port here (the downtime meter's probes fail at once)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache"))
    host = {"gpufleet_node_ip": "127.0.0.1", "gpufleet_nic": "lo", "vllm_service_port": 9}
    tree = {"all": {"children": {"gpu_nodes": {"children": {"ray_head": {"hosts": {"n1": host}}}}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return path


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Path]]:
    """Every reading of an inventory (through Ansible or the cache) and every validation, in a run whose
    stages only report ok and whose head marker is left out."""
    seen: dict[str, list[Path]] = {"read": [], "validated": []}
    read, validate = loaded.read_inventory, loaded.validate_raw

    def reading(path: Path) -> Any:
        seen["read"].append(path)
        return read(path)

    def validating(raw: Any) -> Any:
        seen["validated"].append(raw.path)
        return validate(raw)

    def stages(specs: Any, *_: Any) -> tuple[list[StageResult], dict[str, Any]]:
        measured = {"gpufleet_vllm_facts": ("head", {"weights_gib": 1.0, "kv_cache_tokens": 1000})}
        return [StageResult(name=spec.stage, status="ok", seconds=0.1) for spec in specs], measured

    monkeypatch.setattr(loaded, "read_inventory", reading)
    monkeypatch.setattr(loaded, "validate_raw", validating)
    monkeypatch.setattr(api, "run_stages", stages)
    monkeypatch.setattr(api, "head_marker", lambda *_: None)
    return seen


@pytest.fixture
def fleet_inventory(
    make_inventory: InventoryFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A valid two-node fleet whose endpoint is a closed port here (vLLM bound to loopback on the head)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return make_inventory(group_vars={"vllm_service_port": 9, "vllm_service_host": "127.0.0.1"})


def test_a_deploy_reads_its_inventory_once(inventory: Path, counted: dict[str, list[Path]]) -> None:
    report = api.deploy(inventory, stages=["serve"], validate_inventory=False)

    assert report.ok and report.downtime is not None  # the stages chosen and the endpoint measured
    assert counted == {"read": [inventory], "validated": []}


def test_a_deploy_reads_and_validates_its_inventory_once(
    fleet_inventory: Path, counted: dict[str, list[Path]]
) -> None:
    """Stages, checks and endpoint from one reading and one validation (they were three readings)."""
    report = api.deploy(fleet_inventory, stages=["serve"], validate_inventory=True)

    assert report.ok and report.downtime is not None
    assert counted == {"read": [fleet_inventory], "validated": [fleet_inventory]}


def test_gpufleet_deploy_reads_and_validates_its_inventory_once(
    fleet_inventory: Path, counted: dict[str, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The command's deploy, its comparison with the plan, and the run share one Fleet."""
    path = fleet_inventory

    code = main(["deploy", "-i", str(path), "--stages", "serve", "--json"])

    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["vllm"] is not None, report  # vLLM's facts: compared with the plan
    assert any(warning.startswith("vLLM start-up log:") for warning in report["warnings"]), report
    assert counted == {"read": [path], "validated": [path]}


def test_a_plan_gives_every_stage_the_runs_variables_and_limit(inventory: Path) -> None:
    chosen = deploy_plan(None, stages=["serve", "nodes"], extra_vars={"a": 1}, limit="n1")

    assert chosen == RunPlan((Step("nodes", {"a": 1}, "n1"), Step("serve", {"a": 1}, "n1")))
    assert chosen.stages == ("nodes", "serve")


@pytest.mark.parametrize(
    "value", ["yes", "Yes", "on", "true", "True", "1", 1, True, 1.0, "y", "t", "no", "0", 0, False, None, ""]
)
def test_the_monitoring_stage_is_on_whenever_the_playbooks_bool_says_true(value: object) -> None:
    """The runner may run a stage whose playbook then finds it off, never skip one the playbook would run."""
    assert as_bool(value) or not to_bool(value)


def test_the_published_rollback_is_typed() -> None:
    published = {
        "revision": {"id": "r1", "image_id": "sha256:aa"},
        "restarted": "True",
        "restored": {"n1": ["image", "config"]},
    }

    facts = PublishedFacts.read({"gpufleet_rollback": ("n1", published)})

    assert facts.rollback is not None and facts.rollback.revision is not None
    assert facts.rollback.revision.id == "r1" and facts.rollback.restarted
    assert facts.rollback.restored == {"n1": ("image", "config")}


def test_a_fact_of_the_wrong_shape_is_left_out() -> None:
    published = {"gpufleet_rollback": "text", "gpufleet_ray_gpus": "many", "gpufleet_nodes": []}

    facts = PublishedFacts.read({name: ("n1", value) for name, value in published.items()})

    assert facts.rollback is None and facts.ray_gpus is None and facts.nodes == ()


def test_a_failed_gate_rolls_back_with_the_runs_options_but_not_its_variables(
    inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[Any] = []
    kept = {"revision": {"id": "r0"}, "restarted": True, "restored": {"n1": ["image"]}}

    def stages(specs: Any, *_: Any) -> tuple[list[StageResult], dict[str, Any]]:
        runs.append(specs)
        if specs[0].stage == "rollback":
            done = StageResult(name="rollback", status="ok", seconds=0.1)
            return [done], {"gpufleet_rollback": ("n1", kept)}
        return [StageResult(name="serve", status="failed", seconds=0.1)], {}

    monkeypatch.setattr(api, "run_stages", stages)
    monkeypatch.setattr(api, "head_marker", lambda *_: None)

    report = api.deploy(
        inventory, stages=["serve"], extra_vars={"x": 1}, limit="n1", timeout=30, validate_inventory=False
    )

    assert not report.ok and report.failed_stage == "serve"
    assert report.rollback is not None and report.rollback.ok
    assert report.rollback.restored == {"n1": ("image",)} and report.rollback.restarted
    (served,), (restored,) = runs
    assert restored.extravars == {"gpufleet_revision_slot": "current", "gpufleet_revision_required": False}
    assert (restored.limit, restored.timeout, restored.inventory) == (None, 30, served.inventory)


def test_a_rolling_change_that_restored_its_replica_is_not_rolled_back_again(
    inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """playbooks/serve.yml's rolling change restored the replica that failed, and no other replica changed:
    deploy() reports where it stopped and runs no rollback of every replica after it."""
    runs: list[Any] = []
    stop = {"replica": "tiny-0", "service": "tiny", "node": "n1", "restored": "True", "why": "gate: exited"}

    def stages(specs: Any, *_: Any) -> tuple[list[StageResult], dict[str, Any]]:
        runs.append(specs)
        return [StageResult(name="serve", status="failed", seconds=0.1)], {"gpufleet_rolling": ("n1", stop)}

    monkeypatch.setattr(api, "run_stages", stages)
    monkeypatch.setattr(api, "head_marker", lambda *_: None)

    report = api.deploy(inventory, stages=["serve"], validate_inventory=False)

    assert not report.ok and report.failed_stage == "serve" and report.rollback is None
    assert report.rolling is not None and report.rolling.replica == "tiny-0" and report.rolling.restored
    assert len(runs) == 1
    console = Console(record=True, width=200)
    print_deploy_report(console, report)
    assert "rolling change stopped at replica tiny-0 (tiny, n1): restored" in console.export_text()


def test_the_facts_the_runner_collects_are_the_contracts() -> None:
    """Every gpufleet_* fact the event reader keeps is in the contract (runner/facts.py's docstring) and read
    into PublishedFacts; gpufleet_revisions was kept although no Python read it (the playbooks keep it)."""
    from gpufleet.runner import events, facts

    contract = set(re.findall(r"``(gpufleet_[a-z_]+)``", facts.__doc__ or ""))
    assert contract == events.PUBLISHED_FACTS
