"""``gpufleet deploy/status/teardown`` arguments and errors, and what the display shows of a run."""

from __future__ import annotations

import argparse
import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpufleet.commands import deploy as deploy_command
from gpufleet.commands import rollback as rollback_command
from gpufleet.commands import status as status_command
from gpufleet.commands import teardown as teardown_command
from gpufleet.commands.deploy import exit_code, planned
from gpufleet.runner.availability import INTERVAL, STREAMS
from gpufleet.runner.events import StageRecorder
from gpufleet.runner.progress import LiveProgress, print_deploy_report
from gpufleet.runner.report import DeployReport, RollbackReport, StageResult
from gpufleet.vllm_log import VllmFacts

from .conftest import InventoryFactory
from .test_runner_events import CENSORED, events

Run = tuple[int, str, str]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    parser = argparse.ArgumentParser(prog="gpufleet")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (deploy_command, status_command, teardown_command):
        module.register(subparsers)

    def run(*argv: str) -> Run:
        args = parser.parse_args(argv)
        code = args.func(args)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_deploy_parses_every_option(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    deploy_command.register(parser.add_subparsers())

    args = parser.parse_args(
        [
            "deploy",
            "-i",
            "inv",
            "--bundle",
            "b",
            "--stages",
            "nodes,serve",
            "--check",
            "--limit",
            "head",
            "--json",
        ]
    )

    assert (args.inventory, args.bundle, args.stages, args.check, args.limit, args.json) == (
        Path("inv"),
        Path("b"),
        "nodes,serve",
        True,
        "head",
        True,
    )


@pytest.mark.parametrize("command", ["deploy", "rollback"])
def test_the_load_options_reach_the_run_and_default_to_the_apis(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--load and --load-interval (the measured load of a change of services) are passed to deploy() and
    rollback() as given; without them, the API's defaults."""
    seen: list[tuple[int, float]] = []

    def record(*_args: Any, load: int, load_interval: float, **_kw: Any) -> DeployReport:
        seen.append((load, load_interval))
        return DeployReport(ok=True, seconds=0.0)

    monkeypatch.setattr(deploy_command, "deploy", record)
    monkeypatch.setattr(rollback_command, "rollback", record)
    monkeypatch.setattr(deploy_command, "load", lambda *_a, **_k: FakeFleet())
    monkeypatch.setattr(deploy_command, "finished", lambda report, *_a: report)
    monkeypatch.setattr(rollback_command, "readable", lambda _inventory: None)
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    deploy_command.register(subparsers)
    rollback_command.register(subparsers)
    for argv in (["--load", "1", "--load-interval", "2"], []):
        args = parser.parse_args([command, "-i", str(tmp_path), "--json", *argv])
        assert args.func(args) == 0

    assert seen == [(1, 2.0), (STREAMS, INTERVAL)]


class FakeFleet:
    """What deploy's command does with the fleet it read before deploy() (a test double: no inventory)."""

    def with_extra_vars(self, _variables: Any) -> FakeFleet:
        return self

    def validate(self) -> FakeFleet:
        return self


@pytest.mark.parametrize("command", ["deploy", "status", "teardown"])
def test_a_missing_inventory_is_one_line_and_exit_2(cli: Any, tmp_path: Path, command: str) -> None:
    code, out, err = cli(command, "-i", str(tmp_path / "nope"))

    assert code == 2
    assert out == ""
    assert err.splitlines() == [
        f"inventory {tmp_path / 'nope'}: no such file or directory. "
        "Fix: pass -i with your inventory file or directory (e.g. -i inventories/prod)"
    ]


def test_with_json_a_usage_error_is_still_one_json_object(cli: Any, tmp_path: Path) -> None:
    code, out, _ = cli("deploy", "-i", str(tmp_path / "nope"), "--json")

    assert code == 2
    assert json.loads(out) == {
        "ok": False,
        "problems": [
            f"inventory {tmp_path / 'nope'}: no such file or "
            "directory. Fix: pass -i with your inventory file or "
            "directory (e.g. -i inventories/prod)"
        ],
    }


def test_an_unknown_stage_is_a_usage_error(cli: Any, make_inventory: InventoryFactory) -> None:
    code, _, err = cli("deploy", "-i", str(make_inventory()), "--stages", "nodes,gpu")

    assert code == 2
    assert err.startswith("stage 'gpu': unknown; expected one or more of preflight, nodes, artifacts")
    assert "Traceback" not in err


def test_a_missing_bundle_is_a_usage_error(
    cli: Any, make_inventory: InventoryFactory, tmp_path: Path
) -> None:
    code, _, err = cli("deploy", "-i", str(make_inventory()), "--bundle", str(tmp_path / "dist" / "bundle"))

    assert code == 2
    assert err.splitlines() == [
        f"bundle {tmp_path / 'dist' / 'bundle'}: not a directory. "
        "Fix: pass --bundle the directory `gpufleet bundle build` wrote"
    ]


def test_an_invalid_inventory_stops_deploy_before_any_host(
    cli: Any, make_inventory: InventoryFactory
) -> None:
    def no_head(hosts: dict[str, Any]) -> None:
        del hosts["gpu_nodes"]["children"]["ray_head"]

    code, out, err = cli("deploy", "-i", str(make_inventory(no_head)), "--json")

    assert code == 1
    problems = json.loads(out)["problems"]
    assert any(problem.startswith("group ray_head: hosts: found no host") for problem in problems)
    assert err.splitlines()[-1] == "nothing was changed on any host."


def test_a_missing_playbook_is_a_usage_error(
    cli: Any, make_inventory: InventoryFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "gpufleet"
    (home / "roles").mkdir(parents=True)
    (home / "playbooks").mkdir()
    (home / "site.yml").write_text("[]\n", encoding="utf-8")
    monkeypatch.setenv("GPUFLEET_HOME", str(home))

    code, _, err = cli("teardown", "-i", str(make_inventory()))

    assert code == 2
    assert err.startswith(f"playbook {home / 'playbooks' / 'teardown.yml'}: missing, so stage 'teardown'")


def recorded(name: str, stage: str, progress: LiveProgress | None = None) -> StageResult:
    recorder = StageRecorder(stage, progress)
    for event in events(name):
        recorder(event)
    return recorder.result("ok" if name == "changed" else "failed", 4.0)


def test_failures_show_live_as_they_happen() -> None:
    output = StringIO()
    with LiveProgress(Console(file=output, width=200)) as live:
        live.stage_started("cluster")
        live.stage_finished(recorded("failed", "cluster", live))

    text = output.getvalue()
    assert (
        "FAILED cluster · node-a · Start Ray on node-a: non-zero return code (rc 3): ray: port 6379 already"
        in text
    )
    assert f"FAILED cluster · node-b · Log in with the secret on node-b: {CENSORED}" in text


def test_without_a_terminal_each_stage_prints_lines_as_it_goes() -> None:
    output = StringIO()  # not a terminal: a live table would only appear at the end
    with LiveProgress(Console(file=output, width=200)) as live:
        live.stage_started("nodes")
        assert output.getvalue() == "nodes: started\n"
        live.stage_finished(recorded("changed", "nodes", live))

    lines = output.getvalue().splitlines()
    assert lines[0] == "nodes: started"
    finished = [line for line in lines[1:] if line.startswith("nodes: ")]
    assert finished, lines
    assert all(" ok in " in line and "changed=" in line and "failed=0" in line for line in finished), lines


def test_the_report_names_the_failed_stage_host_task_and_message() -> None:
    stage = recorded("failed", "cluster")
    report = DeployReport(ok=False, stages=(stage,), failed_stage="cluster")
    output = StringIO()

    print_deploy_report(Console(file=output, width=200), report)

    text = output.getvalue()
    assert "cluster · node-a · Start Ray on node-a failed: non-zero return code (rc 3)" in text
    assert "failed in stage cluster" in text


def test_a_failed_rollback_shows_what_failed_in_it() -> None:
    """A deploy whose gate failed and whose rollback failed too: the rollback's own failures are printed,
    not only that it failed."""
    back = RollbackReport(slot="current", ok=False, stage=recorded("failed", "cluster"))
    serve = recorded("failed", "serve")
    report = DeployReport(ok=False, stages=(serve,), failed_stage="serve", rollback=back)
    output = StringIO()

    print_deploy_report(Console(file=output, width=200), report)

    text = output.getvalue()
    assert "rollback (current): the kept revision: did not pass the gate" in text
    # serve's failure and the rollback's
    assert text.count("Start Ray on node-a failed: non-zero return code (rc 3)") == 2
    assert "failed in stage serve; the rollback failed too" in text


def test_the_report_shows_the_endpoint_and_vllms_facts() -> None:
    report = DeployReport(
        ok=True,
        stages=(recorded("changed", "serve"),),
        endpoint="http://10.0.0.1:8000/v1",
        served_model="tiny",
        vllm=VllmFacts(kv_cache_tokens=1048576, max_concurrency=2048.0, ready_seconds=31.5),
        warnings=("vLLM start-up log: kv_cache_tokens: found 1,048,576 tokens; expected 500,000 tokens",),
    )
    output = StringIO()

    print_deploy_report(Console(file=output, width=200), report)

    text = output.getvalue()
    for expected in (
        "endpoint: http://10.0.0.1:8000/v1 (model tiny)",
        "vLLM KV-cache tokens: 1,048,576",
        "vLLM maximum concurrency: 2048.00x",
        "vLLM start to ready: 31.5 s",
        "warning: vLLM start-up log: kv_cache_tokens",
        "deployed",
    ):
        assert expected in text


def test_an_interrupted_run_exits_130() -> None:
    stage = StageResult(name="nodes", status="canceled", seconds=1.0, error="interrupted")

    assert exit_code(DeployReport(ok=False, stages=(stage,), failed_stage="nodes")) == 130
    assert exit_code(DeployReport(ok=True)) == 0


def test_a_run_interrupted_during_its_automatic_rollback_exits_130() -> None:
    failed = StageResult(name="serve", status="failed", seconds=20.0)
    interrupted = StageResult(name="rollback", status="canceled", seconds=3.0, error="interrupted")
    back = RollbackReport(slot="current", ok=False, stage=interrupted)

    assert exit_code(DeployReport(ok=False, stages=(failed,), failed_stage="serve", rollback=back)) == 130
    rolled_back = back.model_copy(update={"stage": StageResult(name="rollback", status="ok", seconds=50.0)})
    assert (
        exit_code(DeployReport(ok=False, stages=(failed,), failed_stage="serve", rollback=rolled_back)) == 1
    )


def test_deploy_compares_vllms_facts_with_the_planners_prediction(make_inventory: InventoryFactory) -> None:
    plan = planned(make_inventory())
    assert plan is not None
    facts = VllmFacts(
        weights_gib=plan.weights_gib_per_gpu, kv_cache_tokens=int((plan.kv_cache_tokens or 0) * 2)
    )

    report = DeployReport(ok=True, vllm=facts).compared_with(plan)

    assert len(report.warnings) == 1
    assert report.warnings[0].startswith("vLLM start-up log: kv_cache_tokens: found ")
    assert "(+100%)" in report.warnings[0]


def test_no_plan_without_a_valid_inventory(tmp_path: Path) -> None:
    assert planned(tmp_path / "nope") is None
