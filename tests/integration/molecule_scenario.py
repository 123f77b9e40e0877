"""Run one Molecule scenario on the lab from pytest, as `make test` does (`molecule test -s NAME`)."""

from __future__ import annotations

import re
import subprocess

from conftest import REPO, ansible_env

from gpufleet.lab_state import load


def run_scenario(scenario: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """``molecule test --scenario-name scenario`` from the repository, output (stdout + stderr) in .stdout."""
    env = ansible_env()
    del env["ANSIBLE_CONFIG"]  # Molecule writes and uses its own ansible.cfg
    return subprocess.run(
        [str(REPO / ".venv/bin/molecule"), "test", "--scenario-name", scenario],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


def unsuccessful_actions(output: str, scenario: str, actions: tuple[str, ...]) -> list[str]:
    """Actions the summary does not list as successful (Molecule writes "➜" on a terminal, ">" otherwise)."""
    return [
        action
        for action in actions
        if not re.search(
            rf"^{re.escape(scenario)} (?:➜|>) {action}: Executed: Successful", output, re.MULTILINE
        )
    ]


def lab_left_up(scenario: str) -> bool:
    """Whether `molecule destroy` left the scenario's lab (molecule-<scenario>) running."""
    return load(f"molecule-{scenario}") is not None
