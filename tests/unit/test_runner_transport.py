"""Which failures are known crashes of the connection layer (gpufleet.runner.transport): as CI saw them."""

from __future__ import annotations

from gpufleet.runner.report import Failure, StageResult
from gpufleet.runner.transport import crashed_stage, transport_crash

# Stop 47's CI (mitogen-hq/mitogen#1314), the failed task's message less the traceback's middle
PROTOCOL = (
    "Task failed: builtins.AttributeError: 'NoneType' object has no attribute 'protocol'\n"
    '  File "/check/work/main/.venv/lib/python3.11/site-packages/mitogen/service.py", line 712, in _forward\n'
)
# Stop 46's CI: the control node's context died while it started
BOOTSTRAP = "Task failed: EOF on stream; last 100 lines received:\nMITO000\n"
# A rehearsal (2026-12-03): the head's context shut down while the serve stage's gate waited on it, after
# ansible_mitogen's "ContextService().put(...): refcount was 0. shutdown_all called?" (#1314's warning)
DISCONNECTED = "Task failed: the respondent Context has disconnected"


def stage(*messages: str, status: str = "failed") -> StageResult:
    failures = tuple(
        Failure(stage="serve", host=f"node{i}", task="t", message=m) for i, m in enumerate(messages)
    )
    return StageResult(name="serve", status=status, seconds=1.0, failures=failures)  # type: ignore[arg-type]


def test_the_crashes_ci_and_rehearsals_saw_are_known_and_named() -> None:
    assert "mitogen#1314" in (transport_crash(PROTOCOL) or "")
    assert "bootstrap" in (transport_crash(BOOTSTRAP) or "")
    assert "mitogen#1314" in (transport_crash(DISCONNECTED) or "")


def test_other_failures_are_not_crashes() -> None:
    for message in (
        "Task failed: EOF on stream; last 100 lines received:\nPermission denied (publickey).\n",
        "node1: expected image gpufleet/vllm-cpu:0.32.0 in docker, found none",
        "AttributeError: 'NoneType' object has no attribute 'protocol'",  # not from mitogen's service
        "",
    ):
        assert transport_crash(message) is None, message


def test_a_stage_is_crashed_only_when_every_failure_is_the_same_crash() -> None:
    """The same crash: one known race, whichever of its symptoms each node showed."""
    assert crashed_stage([stage(PROTOCOL, PROTOCOL)]) is not None
    assert crashed_stage([stage(PROTOCOL, "node2 is broken")]) is None
    assert crashed_stage([stage(PROTOCOL, BOOTSTRAP)]) is None
    assert crashed_stage([stage(DISCONNECTED)]) is not None
    assert crashed_stage([stage(PROTOCOL, DISCONNECTED)]) is not None  # both mitogen#1314, on two nodes
    assert crashed_stage([stage(PROTOCOL, status="timeout")]) is None
    assert crashed_stage([stage()]) is None  # failed before any task (syntax): no failure to read
    assert crashed_stage([]) is None
