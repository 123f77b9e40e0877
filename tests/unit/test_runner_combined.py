"""Several stages in one ansible-playbook run (issue 15: each run paid ~2 s to start), reported stage by
stage.

Real ansible-playbook runs through ansible-runner on two local hosts (``ansible_connection: local``), with
stage playbooks written here: the report must read as if each stage had run alone, a failed stage must end
the run there, and a rescued failure must not count as one."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.runner.arguments import RunSpec, combinable, run_stages
from gpufleet.runner.report import Failure, StageResult

pytestmark = pytest.mark.slow
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}

PING = {"ansible.builtin.ping": {}}
OK_STAGE = [{"name": "Say hello", "hosts": "nodes", "gather_facts": False, "tasks": [PING]}]
PUBLISH = [
    {
        "name": "Publish",
        "hosts": "nodes",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Publish the endpoint",
                "ansible.builtin.set_fact": {"gpufleet_endpoint": "http://a:8000/v1"},
            },
            {"name": "Change something", "ansible.builtin.command": "true", "changed_when": True},
        ],
    }
]
FAIL_ON_A = [
    {
        "name": "Fail on a",
        "hosts": "nodes",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Break on a",
                "ansible.builtin.fail": {"msg": "a is broken"},
                "when": "inventory_hostname == 'a'",
            },
            {"name": "Go on elsewhere", "ansible.builtin.ping": {}},
        ],
    }
]
RESCUED = [
    {
        "name": "Rescue",
        "hosts": "nodes",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Try",
                "block": [{"name": "Fail first", "ansible.builtin.fail": {"msg": "first try"}}],
                "rescue": [{"name": "Recover", "ansible.builtin.ping": {}}],
            }
        ],
    }
]
ALWAYS = [  # as the relay: the block fails, its always tasks still run, the host has failed
    {
        "name": "Always",
        "hosts": "nodes",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Copy",
                "block": [{"name": "Copy fails", "ansible.builtin.fail": {"msg": "copy broke"}}],
                "always": [{"name": "Clean up", "ansible.builtin.ping": {}}],
            }
        ],
    }
]


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def stage_started(self, stage: str) -> None:
        self.calls.append(("started", stage))

    def task_started(self, stage: str, host: str, task: str) -> None:
        pass

    def task_done(self, stage: str, host: str, outcome: str) -> None:
        pass

    def failed(self, failure: Failure) -> None:
        self.calls.append(("failed", f"{failure.stage}/{failure.host}"))

    def stage_finished(self, result: StageResult) -> None:
        self.calls.append(("finished", f"{result.name}:{result.status}"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "hosts.yml").write_text(
        yaml.safe_dump({"nodes": {"hosts": {name: LOCAL for name in ("a", "b")}}})
    )
    return tmp_path


def specs(project: Path, **stages: list[dict[str, Any]]) -> list[RunSpec]:
    made = []
    for name, plays in stages.items():
        playbook = project / "playbooks" / f"{name}.yml"
        playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
        made.append(RunSpec(name, project, playbook, project / "hosts.yml", {}))
    return made


def test_stages_in_one_run_report_each_stage_alone(project: Path) -> None:
    sink = Sink()
    results, facts = run_stages(specs(project, one=OK_STAGE, two=PUBLISH, three=OK_STAGE), sink, None)
    assert [(r.name, r.status) for r in results] == [("one", "ok"), ("two", "ok"), ("three", "ok")]
    two = results[1]
    assert {(h.host, h.ok, h.changed, h.failed) for h in two.hosts} == {("a", 2, 1, 0), ("b", 2, 1, 0)}
    assert {h.host: h.ok for h in results[0].hosts} == {"a": 1, "b": 1}  # the marker and gate are not counted
    assert facts["gpufleet_endpoint"][1] == "http://a:8000/v1"
    assert sink.calls == [
        ("started", "one"), ("finished", "one:ok"),
        ("started", "two"), ("finished", "two:ok"),
        ("started", "three"), ("finished", "three:ok"),
    ]  # fmt: skip


def test_a_stage_that_fails_on_one_host_ends_the_run_there(project: Path) -> None:
    sink = Sink()
    results, _ = run_stages(specs(project, one=OK_STAGE, two=FAIL_ON_A, three=PUBLISH), sink, None)
    assert [(r.name, r.status) for r in results] == [("one", "ok"), ("two", "failed")]
    two = results[1]
    assert [(f.host, f.task, f.message) for f in two.failures] == [("a", "Break on a", "a is broken")]
    assert {h.host: (h.ok, h.failed) for h in two.hosts} == {"a": (0, 1), "b": (1, 0)}  # b went on
    assert ("started", "three") not in sink.calls


def test_a_stage_that_fails_everywhere_ends_the_run_there(project: Path) -> None:
    results, _ = run_stages(specs(project, one=ALWAYS, two=OK_STAGE), None, None)
    assert [(r.name, r.status) for r in results] == [("one", "failed")]
    failures = sorted((f.host, f.message) for f in results[0].failures)
    assert failures == [("a", "copy broke"), ("b", "copy broke")]


def test_a_rescued_failure_is_not_a_failure(project: Path) -> None:
    results, _ = run_stages(specs(project, one=RESCUED, two=OK_STAGE), None, None)
    assert [(r.name, r.status) for r in results] == [("one", "ok"), ("two", "ok")]
    assert results[0].failures == ()
    assert {h.host: (h.failed, h.rescued) for h in results[0].hosts} == {"a": (0, 1), "b": (0, 1)}


def test_a_stage_playbook_that_does_not_parse_fails_the_first_stage_with_its_error(project: Path) -> None:
    made = specs(project, one=OK_STAGE, two=OK_STAGE)
    made[1].playbook.write_text("- hosts: nodes\n  tasks:\n    - no_such_module_here: {}\n")
    results, _ = run_stages(made, None, None)
    assert [(r.name, r.status) for r in results] == [("one", "failed")]
    assert "no_such_module_here" in (results[0].error or ""), results[0]


def test_only_stages_that_differ_in_their_playbook_share_a_run(project: Path) -> None:
    one, two = specs(project, one=OK_STAGE, two=OK_STAGE)
    assert combinable([one, two])
    assert not combinable([one, RunSpec("two", project, two.playbook, two.inventory, {"x": 1})])
    assert not combinable([one, RunSpec("two", project, two.playbook, two.inventory, {}, check=True)])


def test_a_whole_deploy_takes_the_fast_path_and_a_partial_one_does_not(tmp_path: Path) -> None:
    """fleet_check.yml opens preflight and fleet_record.yml closes verify only when every stage runs: with
    --stages (a part), each role's own check decides, and no fleet stamp covers roles that did not run."""
    from gpufleet.runner.combined import WHOLE, combined_playbook

    books = tmp_path / "playbooks"
    books.mkdir()

    def imports(stages: tuple[str, ...]) -> list[str]:
        plays = yaml.safe_load(combined_playbook([(stage, books / f"{stage}.yml") for stage in stages]))
        return [
            Path(p["ansible.builtin.import_playbook"]).name
            for p in plays
            if "ansible.builtin.import_playbook" in p
        ]

    assert "fleet_check.yml" not in imports(WHOLE)  # a project without the fleet playbooks (project_dir)
    (books / "fleet_check.yml").touch()
    (books / "fleet_record.yml").touch()
    whole = imports((*WHOLE, "monitoring"))
    assert whole[0] == "fleet_check.yml" and whole[1] == "preflight.yml"
    assert whole[whole.index("verify.yml") + 1] == "fleet_record.yml"
    assert "fleet_check.yml" not in imports(WHOLE[1:]) and "fleet_record.yml" not in imports(WHOLE[:-1])


# What the failed task said in the CI run of stop 47 (mitogen-hq/mitogen#1314), less the traceback's middle.
MITOGEN_CRASH = (
    "Task failed: builtins.AttributeError: 'NoneType' object has no attribute 'protocol'\n"
    '  File "/check/work/main/.venv/lib/python3.11/site-packages/mitogen/service.py", line 712, in _forward\n'
    "    child = self.router.context_by_id(stream.protocol.remote_id)\n"
)


def crash_once(marker: Path, *, everywhere: bool = True) -> list[dict[str, Any]]:
    """A stage whose first run fails as mitogen's crash does (on a, or on both) and whose second passes."""
    return [
        {
            "name": "Crash once",
            "hosts": "nodes",
            "gather_facts": False,
            "tasks": [
                {"name": "Look", "ansible.builtin.stat": {"path": f"{marker}-{{{{ inventory_hostname }}}}"},
                 "register": "seen"},
                {"name": "Mark", "ansible.builtin.file": {"path": f"{marker}-{{{{ inventory_hostname }}}}",
                                                          "state": "touch"}},
                {"name": "Crash", "ansible.builtin.fail": {"msg": MITOGEN_CRASH},
                 "when": "not seen.stat.exists and (inventory_hostname == 'a' or " + str(everywhere) + ")"},
            ],
        }
    ]  # fmt: skip


def test_a_stage_failed_only_by_a_known_transport_crash_runs_once_more_with_the_stages_after_it(
    project: Path,
) -> None:
    sink = Sink()
    made = specs(project, one=OK_STAGE, two=crash_once(project / "seen"), three=PUBLISH)
    results, facts = run_stages(made, sink, None)
    assert [(r.name, r.status) for r in results] == [("one", "ok"), ("two", "ok"), ("three", "ok")]
    assert results[1].retried is not None and "mitogen-hq/mitogen#1314" in results[1].retried
    assert results[0].retried is None and results[2].retried is None
    assert facts["gpufleet_endpoint"][1] == "http://a:8000/v1"
    assert sink.calls.count(("started", "one")) == 1  # the stages before the crash ran once
    assert sink.calls.count(("started", "two")) == 2


def test_a_stage_that_crashes_again_or_also_fails_otherwise_is_reported_as_it_failed(project: Path) -> None:
    always = [{**crash_once(project / "never")[0], "tasks": [{"name": "Crash", "ansible.builtin.fail":
                                                               {"msg": MITOGEN_CRASH}}]}]  # fmt: skip
    results, _ = run_stages(specs(project, one=always, two=OK_STAGE), None, None)
    assert [(r.name, r.status) for r in results] == [("one", "failed")]
    assert results[0].retried is not None  # ran twice, crashed twice: reported failed, not run a third time

    mixed = [{**FAIL_ON_A[0], "hosts": "b"}, *crash_once(project / "mixed", everywhere=False)]
    mixed[0]["tasks"] = [{"name": "Break on b", "ansible.builtin.fail": {"msg": "b is broken"}}]
    results, _ = run_stages(specs(project, one=mixed, two=OK_STAGE), None, None)
    assert [(r.name, r.status, r.retried) for r in results] == [("one", "failed", None)]
