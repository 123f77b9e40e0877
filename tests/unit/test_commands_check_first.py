"""Issue 37, class 8: the other commands check before they connect. `deploy -e` values are validated whichever
stages run; a `--limit` part that selects no host is named; status, teardown and rollback name an inventory
they cannot read. Nothing runs on a host in any of these cases (the stages are replaced by a tripwire)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli import main
from gpufleet.fleet import load
from gpufleet.runner import api

from .conftest import InventoryFactory


@pytest.fixture
def tripwire(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The stages that would have run (none may, in a refused run)."""
    ran: list[str] = []
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def stages(specs: Any, *_: Any) -> Any:
        ran.extend(spec.stage for spec in specs)
        raise AssertionError(f"stages ran: {ran}")

    monkeypatch.setattr(api, "run_stages", stages)
    monkeypatch.setattr(api, "head_marker", lambda *_: None)
    return ran


def gpufleet(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)["problems"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("vllm_service_executor=rya", "vllm_service_executor: found 'rya'"),
        ("ray_cluster_port=70000", "ray_cluster_port: found '70000'"),
        ("monitoring_alert_kv_cache_usage=95", "a fraction"),
        ("gpufleet_monitoring=perhaps", "gpufleet_monitoring: found 'perhaps'"),
        ("vllm_service_prot=9000", "did you mean vllm_service_port?"),
        ("vllm_service_gpu_memory_utilization=90", "vllm_service_gpu_memory_utilization: found '90'"),
        ("gpufleet_model_dir=/usr", "not /usr"),
    ],
)
def test_deploy_checks_its_extra_variables_whichever_stages_run(
    make_inventory: InventoryFactory,
    tripwire: list[str],
    capsys: pytest.CaptureFixture[str],
    extra: str,
    said: str,
) -> None:
    code, problems = gpufleet(capsys, "deploy", "-i", str(make_inventory()), "--stages", "serve", "-e", extra)

    assert code == 1 and tripwire == [], (code, problems)
    assert any(said in line for line in problems), problems


def test_an_extra_variable_that_is_right_passes_the_checks(
    make_inventory: InventoryFactory, tripwire: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(AssertionError, match="stages ran"):  # the tripwire: the run got as far as the stages
        main(["deploy", "-i", str(make_inventory()), "--stages", "serve", "-e", "ray_cluster_port=7000"])
    assert tripwire == ["serve"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("deploy", "--limit", "nosuch"), "nosuch"),
        (("deploy", "--limit", "typo-host,ray_head"), "typo-host"),
        (("deploy", "--limit", "wrker"), "wrker"),
        (("teardown", "--limit", "nosuch"), "nosuch"),
        (("teardown", "--limit", "gpu_nodes:hed"), "hed"),
    ],
)
def test_a_limit_that_selects_no_host_is_named(
    make_inventory: InventoryFactory,
    tripwire: list[str],
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    named: str,
) -> None:
    code, problems = gpufleet(capsys, argv[0], "-i", str(make_inventory()), *argv[1:])

    assert code == 2 and tripwire == [], (code, problems)
    assert problems[0].startswith(f"command line: --limit: found {named}, which selects no host"), problems
    assert "(hosts: head, worker)" in problems[0] and "Fix: " in problems[0]


@pytest.mark.parametrize("pattern", ["head", "ray_workers", "gpu_nodes:!ray_head", "~w.*", "all", "h*"])
def test_a_limit_that_selects_hosts_runs(
    make_inventory: InventoryFactory, tripwire: list[str], pattern: str
) -> None:
    with pytest.raises(AssertionError, match="stages ran"):
        main(["teardown", "-i", str(make_inventory()), "--limit", pattern])
    assert tripwire == ["teardown"]


UNREADABLE = {
    "binary": b"\x00\x01\x02\xff hosts",
    "a list": b"- head\n- worker\n",
    "no gpu_nodes": b"all:\n  hosts:\n    somewhere: {}\n",
}


@pytest.mark.parametrize("command", ["status", "teardown", "rollback"])
@pytest.mark.parametrize("content", list(UNREADABLE), ids=list(UNREADABLE))
def test_status_teardown_and_rollback_name_an_inventory_they_cannot_read(
    tmp_path: Path, tripwire: list[str], capsys: pytest.CaptureFixture[str], command: str, content: str
) -> None:
    hosts = tmp_path / "hosts.yml"
    hosts.write_bytes(UNREADABLE[content])

    code, problems = gpufleet(capsys, command, "-i", str(hosts))

    assert code == 1 and tripwire == [], (code, problems)
    assert problems and all(": found " in line and ". Fix: " in line for line in problems), problems


def test_the_endpoint_follows_an_extra_variable(make_inventory: InventoryFactory) -> None:
    """The downtime meter polls where -e puts vLLM, not where the inventory had it."""
    fleet = load(make_inventory(), validate=False)

    moved = fleet.with_extra_vars({"vllm_service_port": "9000"})

    assert fleet.endpoint is not None and fleet.endpoint.url.endswith(":8000/v1")
    assert moved.endpoint is not None and moved.endpoint.url.endswith(":9000/v1")
    assert moved.with_extra_vars({"vllm_service_port": "9000"}) is moved  # the same run: not checked again
