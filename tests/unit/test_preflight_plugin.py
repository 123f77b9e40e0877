"""The preflight role's action plugin gives plain ansible-playbook users gpufleet's own validation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import PROD_INVENTORY, REPO, TP_INVENTORY, InventoryFactory

ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def ansible_playbook(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        **(env or {}),
    }
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), *args],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def run_validate_tag(inventory: Path) -> subprocess.CompletedProcess[str]:
    # Only the delegated validation task runs (tag `preflight_validate`): no host is contacted.
    return ansible_playbook(
        str(REPO / "playbooks" / "preflight.yml"), "-i", str(inventory), "--tags", "preflight_validate"
    )


@pytest.mark.slow
def test_valid_inventory_passes_preflight_validation() -> None:
    result = run_validate_tag(PROD_INVENTORY)  # services: each replica planned on its own GPU
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: [gpu-head-01 -> localhost]" in result.stdout


@pytest.mark.slow
def test_the_planners_warnings_reach_ansibles_output() -> None:
    result = run_validate_tag(TP_INVENTORY)  # one instance over an RTX 3090 and an H800: a warning
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


@pytest.mark.slow
def test_facts_of_the_run_so_far_are_not_taken_for_inventory_variables(tmp_path: Path) -> None:
    """The validation reads the inventory, not the facts earlier tasks of the run published (the fast path's
    check, playbooks/fleet_check.yml, hands back the facts of the last converge on nodes still in sync): a
    bug failed a deploy with `gpufleet_endpoint: found a variable gpufleet does not know` when
    ansible-runner's fact cache (jsonfile) held them."""
    playbook = tmp_path / "facts_then_validate.yml"
    playbook.write_text(
        "- hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.set_fact: {gpufleet_endpoint: 'http://10.0.0.1:8000/v1', cacheable: true}\n"
        "    - gpufleet_validate:\n      run_once: true\n      delegate_to: localhost\n"
    )
    env = {
        "GPUFLEET_CACHE_DIR": str(tmp_path / "cache"),  # read through Ansible, not a cached earlier reading
        # a persistent fact cache, as ansible-runner (gpufleet deploy) sets one
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
    }
    done = ansible_playbook(str(playbook), "-i", str(PROD_INVENTORY), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpufleet does not know" not in done.stdout
