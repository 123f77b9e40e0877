"""roles/ray_cluster/tasks/wait.yml reads the probe's answer from its last JSON line, whatever came before.

Found by the 12-host benchmark (2026-11-27 17:21): the probe returned rc 0 without a JSON first line, and
the wait's ``until`` (``stdout | from_json``) raised "Expecting value: line 1 column 1 (char 0)": the task
failed at its first try instead of waiting, and the message said Ray had not answered "within 300 s". Here
the role's own expressions, read from wait.yml, are evaluated by ansible-playbook against registered
results as ``ansible.builtin.command`` returns them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_preflight_plugin import ansible_playbook

REPO = Path(__file__).resolve().parents[2]
WAIT = REPO / "roles" / "ray_cluster" / "tasks" / "wait.yml"
EXPECTED = [{"host": "node1", "ip": "10.0.0.11", "gpus": 0}, {"host": "node2", "ip": "10.0.0.12", "gpus": 0}]
ANSWER = {"alive": [{"ip": "10.0.0.11", "cpus": 2, "gpus": 0}], "missing": [], "unknown": []}


def wait_block() -> dict[str, Any]:
    block: dict[str, Any] = yaml.safe_load(WAIT.read_text(encoding="utf-8"))[0]
    return block


def tasks() -> dict[str, dict[str, Any]]:
    block = wait_block()
    return {task["name"]: task for task in block["block"] + block["rescue"]}


def evaluate_all(
    folder: Path, cases: dict[str, tuple[dict[str, Any], dict[str, str]]]
) -> dict[str, dict[str, Any]]:
    """Per case, each named expression templated by ansible-playbook with ``__ray_cluster_status`` = the
    case's registered result and wait.yml's own block and rescue variables: every case in one run (one
    task each, the registered result as the task's own variable), not one ansible-playbook per case."""
    rescue = tasks()["Read the start of the Ray log of each missing node (its unit's latest run)"]
    play_tasks = []
    for case, (registered, expressions) in cases.items():
        fields = ", ".join(f"'{name}': ({expression})" for name, expression in expressions.items())
        play_tasks.append(
            {
                "name": f"Write what each expression gives: {case}",
                "vars": {"__ray_cluster_status": registered},
                "ansible.builtin.copy": {
                    "content": "{{ {" + fields + "} | to_json }}",
                    "dest": str(folder / f"{case}.json"),
                },
            }
        )
    play = [
        {
            "name": "Evaluate wait.yml's expressions",
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"__ray_cluster_expected": EXPECTED, **wait_block()["vars"], **rescue["vars"]},
            "tasks": play_tasks,
        }
    ]
    playbook = folder / "evaluate.yml"
    playbook.write_text(yaml.safe_dump(play, width=1000), encoding="utf-8")
    run = ansible_playbook(
        "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {case: json.loads((folder / f"{case}.json").read_text(encoding="utf-8")) for case in cases}


def registered(rc: int, stdout: str, stderr: str = "") -> dict[str, Any]:
    """As ansible.builtin.command registers it (msg is '' on exit 0)."""
    return {
        "rc": rc,
        "msg": "" if rc == 0 else "non-zero return code",
        "stdout": stdout,
        "stdout_lines": stdout.splitlines(),
        "stderr": stderr,
        "stderr_lines": stderr.splitlines(),
    }


def until() -> str:
    return " ".join(tasks()["Ask Ray, in the head's container, which nodes are alive"]["until"].split())


LAST_LINE = [
    (0, "", False),  # the probe printed nothing: wait and ask again (raised before)
    (0, "a warning on stdout\n" + json.dumps(ANSWER), True),  # raised before: not JSON at line 1
    (0, json.dumps(ANSWER | {"missing": [EXPECTED[1] | {"why": "not registered"}]}), False),
    (0, "{'a Python dict': 'printed by something else'}\n{\"cut off", False),  # not the probe's line
    (1, "", False),
]
OWN_REASONS = ANSWER | {
    "missing": [EXPECTED[1] | {"why": "not registered with Ray under its gpufleet_node_ip"}]
}


def cases() -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    """Every test's registered result and expressions, by name: templated together (evaluate_all)."""
    record = tasks()["Record the cluster as Ray reports it"]["ansible.builtin.set_fact"][
        "ray_cluster_alive_nodes"
    ]
    missing = {"missing": "__ray_cluster_missing"}
    return {
        **{
            f"last-line-{n}": (registered(rc, stdout), {"until": until()})
            for n, (rc, stdout, _) in enumerate(LAST_LINE)
        },
        "alive": (
            registered(0, "2026-11-27 WARNING something\n" + json.dumps(ANSWER)),
            {"alive": record.strip().removeprefix("{{").removesuffix("}}")},
        ),
        "silent": (registered(1, "", "Error response from daemon: container is restarting"), missing),
        "no-answer": (registered(0, "", ""), missing),
        "own-reasons": (registered(0, "a warning\n" + json.dumps(OWN_REASONS)), missing),
    }


@pytest.fixture(scope="module")
def said(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return evaluate_all(tmp_path_factory.mktemp("ray-wait"), cases())


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(LAST_LINE)))
def test_the_wait_reads_the_last_json_line(said: dict[str, dict[str, Any]], case: int) -> None:
    assert said[f"last-line-{case}"]["until"] is LAST_LINE[case][2], LAST_LINE[case]


@pytest.mark.slow
def test_the_alive_nodes_come_from_the_answer_after_other_output(said: dict[str, dict[str, Any]]) -> None:
    assert said["alive"]["alive"] == ANSWER["alive"]


@pytest.mark.slow
def test_a_silent_probe_names_every_node_with_what_docker_exec_said(said: dict[str, dict[str, Any]]) -> None:
    missing = said["silent"]["missing"]
    assert [entry["host"] for entry in missing] == ["node1", "node2"]
    assert all(
        entry["why"] == "the probe gave no answer (docker exec rc=1: Error response from daemon: "
        "container is restarting)"
        for entry in missing
    ), missing


@pytest.mark.slow
def test_a_probe_that_exits_0_without_an_answer_says_so(said: dict[str, dict[str, Any]]) -> None:
    missing = said["no-answer"]["missing"]
    assert {entry["why"] for entry in missing} == {
        "the probe gave no answer (docker exec rc=0: no output)"
    }, missing


@pytest.mark.slow
def test_the_probe_s_own_reasons_are_kept_when_it_answered(said: dict[str, dict[str, Any]]) -> None:
    assert said["own-reasons"]["missing"] == OWN_REASONS["missing"]
