"""playbooks/vars/replicas.yml reads every node's replica revisions, and a node without a replica has none.

Found on `make demo`'s services (2026-12-05): a whole deploy with tiny lowered from 3 replicas to 2 left node3
without a replica, and verify failed on every node ("object of type 'HostVarsVars' has no attribute
'gpufleet_replica_revisions'"), the rollback after it too: ``map('extract', hostvars, NAME)`` raises on a host
that lacks NAME. Here the file's own expressions are templated by ansible-playbook over three local hosts, one
of them without replicas.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.unit.test_preflight_plugin import ansible_playbook

REPO = Path(__file__).resolve().parents[2]
VARS = REPO / "playbooks" / "vars" / "replicas.yml"


def test_a_node_without_replicas_is_read_as_none(tmp_path: Path) -> None:
    playbook, written = tmp_path / "read.yml", tmp_path / "read.json"
    playbook.write_text(
        f"""
- hosts: all
  gather_facts: false
  connection: local
  vars_files: [{VARS}]
  tasks:
    - name: Each node but node3 read its replica's revision
      ansible.builtin.set_fact:
        gpufleet_replica_revisions: "{{{{ {{replica: {{'fingerprint': fingerprint}}}} }}}}"
      vars:
        replica: "tiny-{{{{ inventory_hostname[-1] }}}}"
        fingerprint: "f{{{{ inventory_hostname }}}}"
      when: inventory_hostname != 'node3'
    - name: Write what the plays compute
      ansible.builtin.copy:
        content: "{{{{ {{'read': __replicas_read, 'revision': __replicas_fleet_revision}} | to_json }}}}"
        dest: "{written}"
        mode: "0600"
      run_once: true
""",
        encoding="utf-8",
    )
    done = ansible_playbook(
        str(playbook), "-i", "node1,node2,node3", "-e", f"ansible_python_interpreter={sys.executable}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    read = json.loads(written.read_text(encoding="utf-8"))
    assert read["read"] == {"tiny-1": {"fingerprint": "fnode1"}, "tiny-2": {"fingerprint": "fnode2"}}
    assert len(read["revision"]) == 12
