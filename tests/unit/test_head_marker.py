"""The run marker on the head (issue 13 item 4): the script that runs there is run here, on a temporary
path, exactly as Ansible's raw module runs it on the head (``python3 -`` with the script on stdin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from gpufleet.runner import DeployError, adhoc, api
from gpufleet.runner.arguments import RunSpec
from gpufleet.runner.head_marker import (
    HOST_SCRIPT,
    HeadBusyError,
    HeadMarker,
    RunHolder,
    changes_hosts,
    control_node,
    script_argv,
)
from gpufleet.runner.report import StageResult


def here(arguments: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-", *arguments], input=HOST_SCRIPT, capture_output=True, text=True, check=True
    )
    return done.stdout


def marker(path: Path, action: str = "deploy", **kwargs: Any) -> HeadMarker:
    return HeadMarker(here, RunHolder.this_run(action, "/inv/hosts.yml"), path=PurePosixPath(path), **kwargs)


def write(path: Path, **fields: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fields), encoding="utf-8")


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_free_fleet_is_marked_and_released(tmp_path: Path) -> None:
    path = tmp_path / "gpufleet" / "run.json"
    mine = marker(path)

    assert mine.acquire() == []
    written = json.loads(path.read_text())
    assert written["run_id"] == mine.holder.run_id
    assert (written["control"], written["pid"], written["action"]) == (control_node(), os.getpid(), "deploy")
    assert abs(written["started"] - time.time()) < 60
    mine.release()
    assert not path.exists()


def test_another_control_nodes_live_run_is_refused_naming_who_since_when(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write(path, run_id="a" * 32, control="ops@laptop", pid=4242, action="deploy", started=time.time() - 60)

    with pytest.raises(HeadBusyError) as refused:
        marker(path).acquire("node1")

    said = str(refused.value)
    assert (
        "node1: another gpufleet run holds this fleet: deploy run aaaaaaaaaaaa of ops@laptop (pid 4242)"
        in said
    )
    assert "since " + time.strftime("%Y-%m-%d", time.gmtime()) in said and "UTC" in said
    assert "Fix:" in said
    assert json.loads(path.read_text())["run_id"] == "a" * 32  # untouched


def test_a_live_run_of_this_control_node_with_another_lock_directory_is_refused(tmp_path: Path) -> None:
    """Two runs on one machine, different XDG_STATE_HOME (two flocks): the marker keeps them apart."""
    path = tmp_path / "run.json"
    first = marker(path)
    first.acquire()

    with pytest.raises(HeadBusyError, match=f"of {control_node()} \\(pid {os.getpid()}\\)"):
        marker(path).acquire()
    assert json.loads(path.read_text())["run_id"] == first.holder.run_id


def test_a_dead_holder_on_this_control_node_is_stale_and_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    gone = dead_pid()
    write(path, run_id="b" * 32, control=control_node(), pid=gone, action="teardown", started=time.time())
    mine = marker(path)

    warnings = mine.acquire()

    assert len(warnings) == 1 and "took over a stale run marker" in warnings[0]
    assert f"its process (pid {gone}) is gone on this control node" in warnings[0]
    assert json.loads(path.read_text())["run_id"] == mine.holder.run_id


def test_a_marker_older_than_the_stale_limit_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write(
        path, run_id="c" * 32, control="ops@laptop", pid=1, action="deploy", started=time.time() - 13 * 3600
    )
    mine = marker(path)

    warnings = mine.acquire()

    assert "13.0 h old, over the stale limit of 12 h" in warnings[0]
    assert json.loads(path.read_text())["run_id"] == mine.holder.run_id


def test_the_stale_limit_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.json"
    write(path, run_id="c" * 32, control="ops@laptop", pid=1, action="deploy", started=time.time() - 7200)
    monkeypatch.setenv("GPUFLEET_RUN_MARKER_STALE_HOURS", "1")

    assert "over the stale limit of 1 h" in marker(path).acquire()[0]


def test_an_unreadable_marker_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_bytes(b"\xff\xfe not json")

    assert "unreadable" in marker(path).acquire()[0]


def test_release_leaves_another_runs_marker(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    mine = marker(path)
    mine.acquire()
    write(path, run_id="d" * 32, control="ops@laptop", pid=1, action="deploy", started=time.time())

    mine.release()

    assert json.loads(path.read_text())["run_id"] == "d" * 32


def test_which_runs_change_hosts() -> None:
    assert not changes_hosts(["preflight"])
    assert not changes_hosts(["preflight", "status"])
    assert changes_hosts(["verify"])  # it records each node's revision once the gate passed
    assert changes_hosts(["rollback"])
    assert changes_hosts(["preflight", "nodes"])
    assert changes_hosts(["teardown"])
    assert changes_hosts(["gateway"])  # a stage added later changes hosts unless listed as read-only
    assert not changes_hosts(["nodes"], check=True)


def test_the_raw_command_runs_the_script(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    holder = RunHolder.this_run("deploy", "/inv")
    encoded = HeadMarker(here, holder, path=PurePosixPath(path))
    command = script_argv(["release", str(path), holder.run_id])
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["released"] is False
    assert encoded.written is False


# ----- the runner holds the marker for the run ----------------------------------------------------------


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A fake deploy: the marker script runs here on a temporary path, the stages are recorded."""
    path = tmp_path / "head" / "run.json"
    seen: dict[str, Any] = {"path": path, "stages": [], "during": [], "cleaned": []}

    def on_head(_spec: RunSpec, arguments: list[str], control: str | None = None) -> str:
        seen["control"] = control
        return here([arguments[0], str(path), *arguments[2:]])

    def run_stages(specs: Any, *_: Any) -> tuple[list[StageResult], dict[str, Any]]:
        seen["during"].append(json.loads(path.read_text()) if path.exists() else None)
        seen["stages"] = [spec.stage for spec in specs]
        return [StageResult(name=s.stage, status=seen.get("status", "ok"), seconds=0.1) for s in specs], {}

    monkeypatch.setattr(adhoc, "on_head", on_head)
    monkeypatch.setattr(api, "run_stages", run_stages)
    monkeypatch.setattr(
        api, "clean_hosts", lambda *args, **kwargs: seen["cleaned"].append((*args, kwargs.get("control")))
    )
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "hosts.yml").write_text("all: {}\n", encoding="utf-8")
    seen["inventory"] = tmp_path / "hosts.yml"
    return seen


def test_deploy_holds_the_marker_while_its_stages_run(fleet: dict[str, Any]) -> None:
    report = api.deploy(fleet["inventory"], stages=["nodes"], validate_inventory=False)

    assert report.ok
    during = fleet["during"][0]
    assert during is not None and during["action"] == "deploy" and during["pid"] == os.getpid()
    assert not fleet["path"].exists()  # released at the end


def test_a_read_only_run_writes_no_marker(fleet: dict[str, Any]) -> None:
    api.deploy(fleet["inventory"], stages=["preflight"], validate_inventory=False)

    assert fleet["during"] == [None]


def test_deploy_refuses_before_any_stage_when_another_control_node_holds_the_fleet(
    fleet: dict[str, Any],
) -> None:
    write(fleet["path"], run_id="e" * 32, control="ci@runner", pid=7, action="teardown", started=time.time())

    with pytest.raises(DeployError, match="teardown run eeeeeeeeeeee of ci@runner"):
        api.deploy(fleet["inventory"], stages=["nodes"], validate_inventory=False)

    assert fleet["stages"] == []
    assert json.loads(fleet["path"].read_text())["run_id"] == "e" * 32


def test_a_stale_marker_is_taken_over_with_a_warning_in_the_report(fleet: dict[str, Any]) -> None:
    write(
        fleet["path"], run_id="f" * 32, control=control_node(), pid=dead_pid(), action="deploy", started=1.0
    )

    report = api.deploy(fleet["inventory"], stages=["nodes"], validate_inventory=False)

    assert report.ok and fleet["stages"] == ["nodes"]
    assert any("took over a stale run marker" in warning for warning in report.warnings)
    assert not fleet["path"].exists()


def test_a_canceled_run_leaves_the_marker_to_the_host_cleanup(fleet: dict[str, Any]) -> None:
    fleet["status"] = "canceled"

    api.deploy(fleet["inventory"], stages=["nodes"], validate_inventory=False)

    (spec, _started, _deadline, run_id, control) = fleet["cleaned"][0]
    assert run_id == fleet["during"][0]["run_id"] and spec.stage == "nodes"
    assert control is None  # an inventory without hosts: no control host; the cleanup runs on every host


def test_the_marker_goes_to_the_control_group_and_else_to_the_ray_head(fleet: dict[str, Any]) -> None:
    """Issue 34 step 6: what runs once per fleet (the marker) lives on gpufleet_control's host, apart from the
    Ray head; an inventory without the group keeps the head."""
    inventory = fleet["inventory"]
    inventory.write_text(
        "all:\n  children:\n    gpu_nodes:\n      children:\n        ray_head: {hosts: {node1: {}}}\n"
        "        ray_workers: {hosts: {node2: {}}}\n",
        encoding="utf-8",
    )
    api.deploy(inventory, stages=["nodes"], validate_inventory=False)
    assert fleet["control"] == "node1"

    inventory.write_text(
        inventory.read_text(encoding="utf-8") + "    gpufleet_control: {hosts: {gateway: {}}}\n",
        encoding="utf-8",
    )
    fleet["status"] = "canceled"
    api.deploy(inventory, stages=["nodes"], validate_inventory=False)
    assert fleet["control"] == "gateway"
    assert fleet["cleaned"][-1][-1] == "gateway"  # the cleanup after a cancel releases the marker there


def test_the_marker_command_is_sent_to_the_control_host(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []

    def raw_on_hosts(_spec: RunSpec, pattern: str, *_: Any, **__: Any) -> None:
        sent.append(pattern)

    monkeypatch.setattr(adhoc, "raw_on_hosts", raw_on_hosts)
    spec = RunSpec(
        stage="nodes", project=Path("."), playbook=Path("p.yml"), inventory=Path("h"), extravars={}
    )
    adhoc.on_head(spec, ["acquire"], "gateway")
    adhoc.on_head(spec, ["acquire"])
    adhoc.clean_hosts(spec, 0.0, time.monotonic() + 60, "r" * 32, control="gateway")
    limited = RunSpec(
        stage="nodes",
        project=Path("."),
        playbook=Path("p.yml"),
        inventory=Path("h"),
        extravars={},
        limit="node2",
    )
    adhoc.clean_hosts(limited, 0.0, time.monotonic() + 60, "r" * 32, control="gateway")
    assert sent == ["gateway", "ray_head[0]", "all:!localhost", "node2:gateway"]
