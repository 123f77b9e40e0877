"""Several stages in one ansible-playbook run, reported stage by stage as if each had run alone.

Each ansible-playbook run pays for its own start: Python and Ansible's plugins, the inventory, and with
mitogen a connection and an interpreter on every node. Measured on the 3-host lab, about 2 s a stage: a third
of a no-op re-run once the roles skip their converge (benchmarks/results/deploy.md). So a deploy runs its
stages as one playbook that imports each stage's playbook between two plays of its own:

- a marker play (``gpufleet stage: <name>``, on localhost, no tasks): its start is where the stage begins;
- a gate play (``gpufleet stage ended: <name>``, on every host, one run_once task): when a host failed or was
  unreachable in the stage, it fails and names them, and a failed run_once task fails every host, so no later
  play runs on any host: the run stops after a failed stage, as separate runs did.

A whole deploy (every stage of :data:`WHOLE`) also opens preflight with ``fleet_check.yml`` and closes verify
with ``fleet_record.yml``, as site.yml does: when every node is still as the last whole deploy left it, the
stage plays have no host, and the recorder marks those stages ``in_sync``.

:class:`CombinedRecorder` splits the events at the markers into one :class:`StageRecorder` per stage and ends
each stage with the gate's verdict (Ansible's recap covers the whole run, so the hosts the gate names are
what makes a host's last failure the one that ended it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpufleet.runner.events import ProgressSink, StageRecorder
from gpufleet.runner.report import StageResult, StageStatus

MARKER = "gpufleet stage: "
GATE = "gpufleet stage ended: "
_FAILED = ("runner_on_failed", "runner_on_unreachable")
# The stages of a whole deploy: its fleet stamp lets a re-run that changes nothing skip all but verify.
WHOLE = ("preflight", "nodes", "artifacts", "cluster", "serve", "verify")
FLEET_PLAYBOOKS = ("fleet_check.yml", "fleet_record.yml")  # opening the first stage, closing the last
# fleet_check.yml's last task: it runs (ok) only when every node is in sync, and the stages then have no host.
FAST_TASK = "Leave every stage but verify out when every node is in sync"
# fleet_check.yml's question to each node: its result says whether the node is in sync, and if not, why.
CHECK_TASK = "Ask each node whether every role's last converge still holds"
Facts = dict[str, tuple[str, Any]]


def combined_playbook(stages: Sequence[tuple[str, Path]]) -> str:
    """The playbook that runs every (stage, playbook) in order, with its marker and its gate. A whole deploy
    (every stage of :data:`WHOLE`) also takes the fast path as site.yml does: fleet_check.yml at the start of
    preflight, fleet_record.yml at the end of verify."""
    gone = "ansible_play_hosts_all | difference(ansible_play_hosts)"
    books = {stage: playbook.parent for stage, playbook in stages}
    # (a project of its own, project_dir, may have no fleet playbooks: its stages run as they are)
    whole = set(WHOLE) <= set(books) and all((books[WHOLE[0]] / name).is_file() for name in FLEET_PLAYBOOKS)
    plays: list[dict[str, Any]] = []
    for stage, playbook in stages:
        imports = [playbook]
        if whole and stage == WHOLE[0]:
            imports.insert(0, books[stage] / FLEET_PLAYBOOKS[0])
        if whole and stage == WHOLE[-1]:
            imports.append(books[stage] / FLEET_PLAYBOOKS[1])
        plays += [
            {"name": MARKER + stage, "hosts": "localhost", "gather_facts": False, "tasks": []},
            *({"name": f"Stage {stage}", "ansible.builtin.import_playbook": str(path)} for path in imports),
            {
                "name": GATE + stage,
                "hosts": "all",
                "gather_facts": False,
                "tasks": [
                    {
                        "name": f"Stop the run here: a host failed or was unreachable in stage {stage}",
                        "ansible.builtin.fail": {"msg": "{{ " + gone + " | to_json }}"},
                        "when": gone + " | length > 0",
                        "run_once": True,
                    }
                ],
            },
        ]
    return "---\n# Written by gpufleet for one run (gpufleet.runner.combined); not kept.\n" + yaml.safe_dump(
        plays, sort_keys=False, width=1000
    )


class CombinedRecorder:
    """The ``event_handler`` of a combined run: one StageRecorder per stage, split at the marker plays."""

    def __init__(self, first: str, progress: ProgressSink | None = None) -> None:
        self.progress = progress
        self.results: list[StageResult] = []
        self.facts: Facts = {}
        self._stage: StageRecorder | None = None
        self._began = 0.0
        self._gate: str | None = None  # "passed", "failed" or None (no verdict yet)
        self._failed: frozenset[str] = frozenset()
        self._failing: set[str] = set()  # hosts with a failure in the stage (all of them, when no gate ran)
        self._in_gate = False
        self._stopped = False
        self.in_sync = (
            False  # every node as the last whole deploy left it: the stages but verify have no host
        )
        self._not_in_sync: dict[str, str] = {}  # what the fleet check found on each node out of sync
        # ansible-playbook's words before any stage began (a stage playbook that does not parse)
        self._before = StageRecorder(first)

    def __call__(self, event: Mapping[str, Any]) -> bool:
        kind = str(event.get("event", ""))
        data: Mapping[str, Any] = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            name = str(data.get("play") or data.get("name") or "")
            self._in_gate = name.startswith(GATE)
            if name.startswith(MARKER):
                self._next(name.removeprefix(MARKER))
                return False
        if self._stopped or kind == "playbook_on_stats":  # the recap covers every stage: not one's
            return False
        if self._in_gate:
            self._verdict(kind, data)
            return False
        if kind == "runner_on_ok" and data.get("task") == FAST_TASK:
            self.in_sync = True
        if kind == "runner_on_ok" and data.get("task") == CHECK_TASK:
            answer = data.get("res") or {}
            if answer.get("in_sync") is False:
                self._not_in_sync[str(data.get("host"))] = str(answer.get("why") or "not said")
        if kind in _FAILED and not data.get("ignore_errors"):
            self._failing.add(str(data.get("host")))
        return (self._stage or self._before)(event)

    def finish(self, outcome: StageStatus) -> list[StageResult]:
        """The results of the stages that ran; the last one ends with the run's outcome."""
        if self._stage is None and not self.results and outcome != "ok":  # stopped before the first stage
            if self.progress:
                self.progress.stage_started(self._before.stage)
            self.results.append(self._before.result(outcome, 0.0))
            if self.progress:
                self.progress.stage_finished(self.results[-1])
        elif self._stage is not None:
            self._end(outcome)
        return self.results

    def _verdict(self, kind: str, data: Mapping[str, Any]) -> None:
        if kind == "runner_on_skipped":
            self._gate = "passed"
        elif kind == "runner_on_failed":
            self._gate = "failed"
            try:
                self._failed = frozenset(str(host) for host in json.loads(str(data["res"]["msg"])))
            except (KeyError, TypeError, ValueError):
                self._failed = frozenset(self._failing)

    def _next(self, stage: str) -> None:
        if self._stage is not None:  # no gate verdict: no host was left to ask (all failed), or none ran
            self._end("failed" if self._gate == "failed" or (self._gate is None and self._failing) else "ok")
        if self._stopped:
            return
        self._stage, self._began = StageRecorder(stage, self.progress), time.monotonic()
        self._gate, self._failed, self._failing = None, frozenset(), set()
        if self.progress:
            self.progress.stage_started(stage)

    def _end(self, status: StageStatus) -> None:
        assert self._stage is not None  # only called while a stage runs
        failed = self._failed if self._gate == "failed" else frozenset(self._failing)
        if status == "ok":
            failed = frozenset()  # every failure was rescued
        result = self._stage.result(status, time.monotonic() - self._began, failed_hosts=failed)
        if self.in_sync and not result.hosts:
            result = result.model_copy(update={"in_sync": True})
        if self._not_in_sync:  # the stage the fleet check opened
            result = result.model_copy(update={"not_in_sync": dict(sorted(self._not_in_sync.items()))})
            self._not_in_sync = {}
        self.results.append(result)
        self.facts.update(self._stage.facts)
        if self.progress:
            self.progress.stage_finished(result)
        self._stage = None
        self._stopped = status != "ok"
