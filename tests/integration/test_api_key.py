"""The vllm_service role's API key on the control node, with real ansible-playbook on this machine.

Only the role's ``api_key`` tasks run (``tasks_from``), on an inventory host that is this machine, so no lab
is needed: check mode writes no key file; a real run generates one (0600, 64 characters) and never prints
it; the next run reads the same key.
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN, ansible_env
from test_model_fetch import said

pytestmark = [pytest.mark.timeout(300)]

PLAYBOOK = """
- name: The API key tasks of vllm_service
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Generate or read the key
      ansible.builtin.include_role:
        name: vllm_service
        tasks_from: api_key
    - name: Record the key's length (never the key)
      ansible.builtin.debug:
        msg: "key length {{ __vllm_service_api_key | length }}"
"""


def run(tmp_path: Path, key_file: Path, *extra: str) -> str:
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK, encoding="utf-8")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "gpu_nodes:\n  hosts:\n    head:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {VENV_BIN / 'python'}\n",
        encoding="utf-8",
    )
    env = ansible_env() | {"ANSIBLE_ROLES_PATH": str(REPO / "roles")}
    result = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(playbook),
         "-e", f"vllm_service_api_key_file={key_file}", *extra],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result.stdout


def test_check_mode_writes_no_key_and_a_real_run_writes_one_key(tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "gpufleet.apikey"
    key_file.parent.mkdir()

    checked = run(tmp_path, key_file, "--check")
    assert not key_file.exists(), "check mode wrote the API key file"
    assert said(checked, f"{key_file} does not exist on the control node"), checked

    first = run(tmp_path, key_file)
    key = key_file.read_text(encoding="utf-8").strip()
    assert len(key) == 64 and key.isalnum()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert said(first, "key length 64"), first
    assert key not in first

    second = run(tmp_path, key_file, "--check")
    assert key_file.read_text(encoding="utf-8").strip() == key, "the key changed on a later run"
    assert not said(second, "does not exist") and key not in second
