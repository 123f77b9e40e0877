"""Known crashes of the connection layer: a stage that failed only through one runs once more.

Mitogen's strategy (the runner's default, :data:`gpufleet.runner.arguments.STRATEGIES`) has an open race,
mitogen-hq/mitogen#1314: under load a node's mitogen context dies between two tasks (``Latch._get_sleep``
raises TimeoutError with no timeout set), and the next task on that node fails before it starts, with
``AttributeError: 'NoneType' object has no attribute 'protocol'`` from ``mitogen/service.py``. The task
never ran on the node and every stage is idempotent, so running the stage again (from the stage that failed
on) is what the user would do by hand; the runner does it once and says so in the report
(``StageResult.retried``). The same for a mitogen context that died while it started (stop 46's CI), and
for one shut down while a task ran on it (a rehearsal: the serve stage's wait for vLLM, right after #1314's
warning "ContextService().put(...): refcount was 0"; the task only waited; the stage run again waits again).
A failure of anything else, or one crash among other failures, is reported as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.runner.report import StageResult

# (what names the crash in the report, strings that all appear in the failed task's message)
CRASHES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "mitogen-hq/mitogen#1314 (a node's mitogen context died between two tasks)",
        ("/mitogen/service.py", "object has no attribute 'protocol'"),
    ),
    # Stop 46's CI: the control node's own mitogen context died between its first bootstrap stage (which
    # printed MITO000) and the second, at the first task delegated to localhost; nothing had run yet.
    (
        "mitogen's bootstrap (a mitogen context died while it started: EOF on stream after MITO000)",
        ("EOF on stream; last 100 lines received", "MITO000"),
    ),
    # mitogen.core.Router.respondent_disconnect_msg: the context a task ran in went away before it answered
    (
        "mitogen-hq/mitogen#1314 (a node's mitogen context shut down while a task ran on it)",
        ("the respondent Context has disconnected",),
    ),
)


def transport_crash(text: str) -> str | None:
    """The crash whose marks are all in ``text`` (a task's message, a playbook's output); None: none."""
    for name, marks in CRASHES:
        if all(mark in text for mark in marks):
            return name
    return None


def crashed_stage(results: Sequence[StageResult]) -> str | None:
    """The crash that alone failed the last stage of ``results``; None when it failed (or not) otherwise."""
    if not results or results[-1].status != "failed" or not results[-1].failures:
        return None
    crashes = {transport_crash(failure.message) for failure in results[-1].failures}
    if None in crashes:
        return None
    # one race, two symptoms on two nodes of one stage (rehearsal: #1314's 'protocol' on one node, its
    # disconnected respondent on the other, in the rollback stage): the same crash
    causes = {str(crash).split(" (")[0] for crash in crashes}
    return "; ".join(sorted(str(crash) for crash in crashes)) if len(causes) == 1 else None
