"""The verify stage's published fact reaches deploy()'s report, and the report says when nothing changed."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from gpufleet.runner.combined import CHECK_TASK, MARKER, CombinedRecorder
from gpufleet.runner.events import StageRecorder
from gpufleet.runner.facts import PublishedFacts
from gpufleet.runner.progress import print_deploy_report
from gpufleet.runner.report import DeployReport, HostResult, StageResult, VerifyResult

PUBLISHED = {
    "completion": "hello cluster",
    "completion_tokens": "16",
    "unauthorized_status": "401",
    "metrics": True,
    "benchmark": None,
}


def test_the_recorder_keeps_the_verify_fact() -> None:
    recorder = StageRecorder("verify")
    recorder(
        {
            "event": "runner_on_ok",
            "event_data": {
                "host": "node1",
                "task": "Publish",
                "res": {"ansible_facts": {"gpufleet_verify": PUBLISHED}},
            },
        }
    )

    assert recorder.facts["gpufleet_verify"] == ("node1", PUBLISHED)


def test_the_verify_fact_becomes_a_typed_result() -> None:
    result = PublishedFacts.read({"gpufleet_verify": ("node1", PUBLISHED)}).verify

    assert result == VerifyResult(
        completion="hello cluster", completion_tokens=16, unauthorized_status=401, metrics=True
    )


def test_a_malformed_verify_fact_is_left_out() -> None:
    assert PublishedFacts.read({"gpufleet_verify": ("node1", {"completion_tokens": 3})}).verify is None


def stage(changed: int) -> StageResult:
    return StageResult(
        name="verify", status="ok", seconds=1.0, hosts=(HostResult(host="node1", ok=9, changed=changed),)
    )


def test_a_run_that_changed_nothing_says_so() -> None:
    output = StringIO()
    report = DeployReport(ok=True, stages=(stage(0),), verify=VerifyResult(completion="hi", metrics=True))

    print_deploy_report(Console(file=output, width=200), report)

    assert report.changed == 0
    assert "deployed (no changes)" in output.getvalue()
    assert "verify: completion 'hi'" in output.getvalue()


def test_a_run_that_changed_something_does_not_say_no_changes() -> None:
    output = StringIO()

    print_deploy_report(Console(file=output, width=200), DeployReport(ok=True, stages=(stage(2),)))

    assert "no changes" not in output.getvalue()


def test_a_whole_deploy_that_ran_every_stage_says_which_nodes_differed_and_why() -> None:
    """The fleet check's answer on each node out of sync reaches the report (CombinedRecorder) and the
    printed summary."""
    recorder = CombinedRecorder("preflight")
    answers = {"node1": (True, "in sync"), "node2": (False, "fleet: docker: unit docker.service is 'failed'")}
    answers["node3"] = answers["node2"]
    for event in (
        {"event": "playbook_on_play_start", "event_data": {"play": MARKER + "preflight"}},
        *(
            {
                "event": "runner_on_ok",
                "event_data": {"host": host, "task": CHECK_TASK, "res": {"in_sync": ok, "why": why}},
            }
            for host, (ok, why) in answers.items()
        ),
        {"event": "playbook_on_play_start", "event_data": {"play": MARKER + "nodes"}},
    ):
        recorder(event)
    stages = tuple(recorder.finish("ok"))
    report = DeployReport(ok=True, stages=stages)
    assert [stage.name for stage in stages] == ["preflight", "nodes"]
    assert report.not_in_sync == dict.fromkeys(["node2", "node3"], answers["node2"][1])
    assert stages[1].not_in_sync == {}  # the stage the check opened carries it, once
    output = StringIO()
    print_deploy_report(Console(file=output, width=200), report)
    said = output.getvalue()
    assert "every stage ran because of node2, node3: fleet: docker: unit docker.service is 'failed'" in said
    assert "node1" not in said, said
