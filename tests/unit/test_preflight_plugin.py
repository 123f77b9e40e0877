"""The preflight role's action plugin gives plain ansible-playbook users gpufleet's own validation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import PROD_INVENTORY, REPO, InventoryFactory

ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def run_validate_tag(inventory: Path) -> subprocess.CompletedProcess[str]:
    # Only the delegated validation task runs (tag `preflight_validate`): no host is contacted.
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            str(REPO / "playbooks" / "preflight.yml"),
            "-i",
            str(inventory),
            "--tags",
            "preflight_validate",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_valid_inventory_passes_preflight_validation() -> None:
    result = run_validate_tag(PROD_INVENTORY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: [gpu-head-01 -> localhost]" in result.stdout
    assert "GPUs differ" in result.stderr + result.stdout  # the planner's warnings reach ansible's output


@pytest.mark.slow
def test_invalid_inventory_stops_the_play_with_every_problem(make_inventory: InventoryFactory) -> None:
    result = run_validate_tag(
        make_inventory(group_vars={"vllm_service_port": 0, "vllm_service_dtype": "bf16"})
    )
    assert result.returncode == 2, result.stdout + result.stderr  # ansible-playbook: a host failed
    assert "nothing was changed on any host" in result.stdout
    assert "vllm_service_port: found 0" in result.stdout
    assert "vllm_service_dtype: found 'bf16'" in result.stdout
