"""Recorded ansible-runner events (data/runner_events/, made by record.py there) into stage results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.runner.events import StageRecorder, failure_message
from gpufleet.runner.report import Failure, HostResult, StageResult

EVENTS = Path(__file__).parent / "data" / "runner_events"
SECRET = "s3cr3t-token-0042"  # what record.py's no_log tasks echoed
CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"


def events(name: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads((EVENTS / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


def record(name: str, status: str = "ok", recorder: StageRecorder | None = None) -> StageResult:
    recorder = recorder or StageRecorder("serve")
    for event in events(name):
        assert recorder(event) is False  # ansible-runner then writes no artifact for it
    return recorder.result(status, 12.5)  # type: ignore[arg-type]


class Sink:
    """Records what a ProgressSink is told (the display itself: test_runner_cli.py)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def stage_started(self, stage: str) -> None:
        self.calls.append(("stage_started", stage))

    def task_started(self, stage: str, host: str, task: str) -> None:
        self.calls.append(("task_started", host, task))

    def task_done(self, stage: str, host: str, outcome: str) -> None:
        self.calls.append(("task_done", host, outcome))

    def failed(self, failure: Failure) -> None:
        self.calls.append(("failed", failure.host, failure.task))

    def stage_finished(self, result: StageResult) -> None:
        self.calls.append(("stage_finished", result.name))


@pytest.mark.parametrize("name", ["changed", "failed", "unreachable", "syntax_error"])
def test_ansible_runner_censors_no_log_results_before_they_reach_gpufleet(name: str) -> None:
    assert SECRET not in (EVENTS / f"{name}.json").read_text(encoding="utf-8")


def test_counts_come_from_the_recap() -> None:
    result = record("changed")

    assert result.hosts == (
        HostResult(host="node-a", ok=3, changed=1, skipped=1, seconds=result.hosts[0].seconds),
        HostResult(host="node-b", ok=2, changed=1, skipped=2, seconds=result.hosts[1].seconds),
    )
    assert all(0 < host.seconds < 60 for host in result.hosts)
    assert (result.status, result.seconds, result.failures, result.error) == ("ok", 12.5, (), None)


def test_published_facts_are_kept_with_the_host_that_set_them() -> None:
    recorder = StageRecorder("serve")
    record("changed", recorder=recorder)

    endpoint, facts = recorder.facts["gpufleet_endpoint"], recorder.facts["gpufleet_vllm_facts"]
    assert set(recorder.facts) == {"gpufleet_endpoint", "gpufleet_vllm_facts"}
    assert endpoint == ("node-a", "http://10.0.0.1:8000/v1")
    assert facts[0] == "node-a"
    assert {k: v for k, v in facts[1].items() if v is not None} == {
        "kv_cache_device": "CPU",
        "kv_cache_tokens": 1048576,
        "max_concurrency": 2048.0,
        "max_concurrency_request_tokens": 512,
        "served_model_name": "tiny",
        "executor": "uni",
    }


def test_failures_name_host_task_and_message() -> None:
    result = record("failed", status="failed")

    assert result.failures == (
        Failure(
            stage="serve",
            host="node-a",
            task="Start Ray on node-a",
            message="non-zero return code (rc 3): ray: port 6379 already in use",
        ),
        Failure(stage="serve", host="node-b", task="Log in with the secret on node-b", message=CENSORED),
    )
    assert result.error is None


def test_ignored_and_rescued_failures_are_counted_but_not_reported() -> None:
    result = record("failed", status="failed")

    assert [(h.host, h.failed, h.ignored, h.rescued) for h in result.hosts] == [
        ("node-a", 1, 1, 1),
        ("node-b", 1, 1, 1),
    ]
    assert "rescued failure" not in result.model_dump_json()


def test_without_a_recap_every_failure_seen_is_reported() -> None:
    """A canceled run ends before Ansible's recap; then nothing tells a rescued failure from a real one."""
    recorder = StageRecorder("cluster")
    for event in events("failed"):
        if event["event"] != "playbook_on_stats":
            recorder(event)

    result = recorder.result("canceled", 3.0)

    assert [(f.host, f.task) for f in result.failures] == [
        ("node-a", "Fail and be rescued"),
        ("node-a", "Start Ray on node-a"),
        ("node-b", "Fail and be rescued"),
        ("node-b", "Log in with the secret on node-b"),
    ]
    assert [(h.host, h.ok, h.failed, h.ignored) for h in result.hosts] == [
        ("node-a", 2, 2, 1),
        ("node-b", 2, 2, 1),
    ]


def test_an_unreachable_host_is_a_failure_that_says_so() -> None:
    result = record("unreachable", status="failed")

    assert result.hosts[0].unreachable == 1
    (failure,) = result.failures
    assert (failure.host, failure.task, failure.unreachable) == ("node-c", "Ping", True)
    assert "Failed to connect to the host via ssh" in failure.message
    assert "Connection refused" in failure.message


def test_a_failed_run_whose_tasks_ran_without_a_standing_failure_does_not_say_nothing_ran() -> None:
    """Rehearsal of 2026-12-02: rollback.yml exited 2 after 30 tasks on the head, no failure standing (a
    rescued one in a play with any_errors_fatal), and the report said "failed before any task ran"."""
    result = record("changed", status="failed")

    assert result.failures == () and result.hosts
    assert result.error is not None and "before any task ran" not in result.error
    assert "no host's failure stood" in result.error and "any_errors_fatal" in result.error


def test_a_playbook_that_does_not_parse_reports_ansibles_error() -> None:
    result = record("syntax_error", status="failed")

    assert (result.hosts, result.failures) == ((), ())
    assert result.error is not None
    assert result.error.startswith("[ERROR]: YAML parsing failed: While parsing a flow mapping")
    assert "syntax_error.yml:7:1" in result.error


def test_the_progress_sink_sees_tasks_and_failures_as_they_happen() -> None:
    sink = Sink()
    record("failed", status="failed", recorder=StageRecorder("cluster", sink))

    # Hosts run in parallel: their events interleave in whatever order they finished.
    assert set(sink.calls[:2]) == {
        ("task_started", "node-a", "Fail but ignore it"),
        ("task_started", "node-b", "Fail but ignore it"),
    }
    assert set(sink.calls[2:4]) == {("task_done", "node-a", "ignored"), ("task_done", "node-b", "ignored")}
    assert ("failed", "node-a", "Start Ray on node-a") in sink.calls
    assert ("failed", "node-b", "Log in with the secret on node-b") in sink.calls
    assert ("failed", "node-a", "Fail but ignore it") not in sink.calls


@pytest.mark.parametrize(
    ("res", "message"),
    [
        ({"censored": CENSORED, "msg": "never read"}, CENSORED),
        ({"msg": "Could not find docker", "rc": 0}, "Could not find docker"),
        ({"stdout": "only stdout"}, "only stdout"),
        ({}, "failed without a message"),
        (
            {
                "msg": "One or more items failed",
                "results": [{"failed": False}, {"failed": True, "msg": "bad item"}],
            },
            "One or more items failed: bad item",
        ),
        (
            {"msg": "One or more items failed", "results": [{"censored": CENSORED}]},
            f"One or more items failed: {CENSORED}",
        ),
    ],
)
def test_failure_message(res: dict[str, Any], message: str) -> None:
    assert failure_message(res) == message


def test_failure_message_is_bounded() -> None:
    message = failure_message({"msg": "x" * 5000})

    assert len(message) == 2000
    assert "\n…\n" in message


def test_a_bounded_message_keeps_its_head_and_the_last_lines_of_its_log() -> None:
    """A failure that shows vLLM's log ends with the crash: the middle goes, not the end (a broken image's
    "exits at start" line was cut off the report)."""
    log = "\n".join(f"line {number}" for number in range(1000))
    said = f"node1: vLLM did not list the model. Last lines:\n{log}\nexits at start"
    message = failure_message({"msg": said})

    assert message.startswith("node1: vLLM did not list the model.")
    assert message.endswith("line 999\nexits at start")
    assert len(message) == 2000


def test_each_nodes_replicas_are_merged_into_the_report() -> None:
    """Services: every node publishes the replicas it runs (gpufleet_replicas, by instance id); the report
    keeps them all, not the last node's, each with its own vLLM facts."""
    from gpufleet.runner.facts import PublishedFacts

    recorder = StageRecorder("serve")

    def published(host: str, replicas: dict[str, Any]) -> dict[str, Any]:
        return {"event": "runner_on_ok", "event_data": {"host": host, "res": {"ansible_facts": replicas}}}

    tiny = {"kv_cache_tokens": 8192, "ready_seconds": 30.0, "served_model_name": "tiny"}
    first = {"service": "tiny", "node": "node1", "url": "http://10.0.0.1:8100", "gpus": [0], "facts": tiny}
    recorder(published("node1", {"gpufleet_replicas": {"tiny-0": first}}))
    second = {**first, "node": "node2", "url": "http://10.0.0.2:8100", "gpus": [], "facts": {}}
    recorder(published("node2", {"gpufleet_replicas": {"tiny-1": second}}))
    chat = {**first, "service": "chat", "url": "http://10.0.0.1:8101", "gpus": [1]}
    recorder(published("node1", {"gpufleet_replicas": {"tiny-0": first, "chat-0": chat}}))

    replicas = PublishedFacts.read(recorder.facts).replicas
    assert [(r.id, r.service, r.node, r.url, r.gpus) for r in replicas] == [
        ("chat-0", "chat", "node1", "http://10.0.0.1:8101", (1,)),
        ("tiny-0", "tiny", "node1", "http://10.0.0.1:8100", (0,)),
        ("tiny-1", "tiny", "node2", "http://10.0.0.2:8100", ()),
    ]
    assert replicas[1].vllm is not None and replicas[1].vllm.kv_cache_tokens == 8192
    assert replicas[2].vllm is None
