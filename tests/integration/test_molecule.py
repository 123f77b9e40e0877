"""Molecule runs on the lab: `molecule test -s lab_wiring` (check, converge, idempotence, testinfra
verify, destroy on three lab hosts) passes, and leaves no lab behind."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import REPO, ansible_env, skip_unless_lab_possible

from gpufleet.lab_state import load

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(600)]

SCENARIO = "lab_wiring"


def test_lab_wiring_scenario_passes() -> None:
    skip_unless_lab_possible()
    env = ansible_env()
    del env["ANSIBLE_CONFIG"]  # Molecule writes and uses its own ansible.cfg (from molecule/shared/base.yml)
    result = subprocess.run(
        [str(REPO / ".venv/bin/molecule"), "test", "--scenario-name", SCENARIO],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=540,
        check=False,
    )
    tail = result.stdout[-6000:]
    assert result.returncode == 0, tail
    for action in ("check", "converge", "idempotence", "verify", "destroy"):
        # Molecule writes "lab_wiring ➜ verify" on a terminal and "lab_wiring > verify" elsewhere.
        assert re.search(rf"{SCENARIO} \S+ {action}: Executed: Successful", result.stdout), tail
    assert load(f"molecule-{SCENARIO}") is None, "destroy left the lab up"
