"""molecule/model_fetch: prepare (a bundle holding the tiny model) -> check -> converge -> idempotence ->
testinfra verify -> destroy on three lab hosts; no lab is left behind."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import REPO, ansible_env, skip_unless_lab_possible

from gpufleet.lab_state import load

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(1200)]


def run_scenario(scenario: str) -> None:
    skip_unless_lab_possible()
    env = ansible_env()
    del env["ANSIBLE_CONFIG"]  # Molecule writes and uses its own ansible.cfg
    result = subprocess.run(
        [str(REPO / ".venv/bin/molecule"), "test", "--scenario-name", scenario],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1140,
        check=False,
    )
    tail = result.stdout[-6000:]
    assert result.returncode == 0, tail
    for action in ("prepare", "check", "converge", "idempotence", "verify", "destroy"):
        assert re.search(rf"{scenario} \S+ {action}: Executed: Successful", result.stdout), tail
    assert load(f"molecule-{scenario}") is None, "destroy left the lab up"


def test_model_fetch_scenario_passes() -> None:
    run_scenario("model_fetch")
