"""Record real ansible-runner events for the unit tests of gpufleet.runner.events.

Run from the repository root with the project's virtual environment:

    .venv/bin/python tests/unit/data/runner_events/record.py

Each scenario runs a small playbook through ansible-runner against two local hosts (ansible_connection=local)
and writes every event ansible-runner handed to the event handler to ``<scenario>.json`` beside this file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import ansible_runner

HERE = Path(__file__).parent
REPO = HERE.parents[3]
SECRET = "s3cr3t-token-0042"
PYTHON = sys.executable
INVENTORY = f"""
[gpu_nodes]
node-a ansible_connection=local ansible_python_interpreter={PYTHON}
node-b ansible_connection=local ansible_python_interpreter={PYTHON}
[unreachable]
node-c ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=1 ansible_user=nobody
"""
VLLM_LOG = REPO / "tests" / "unit" / "data" / "vllm_logs" / "v0.32_cpu_merged_line.log"

PLAYBOOKS = {
    # First run on a clean directory: one change per host, published facts, a no_log task, a skip.
    "changed": f"""
- name: Serve (recorded)
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Write the marker file
      ansible.builtin.copy:
        content: "hello\\n"
        dest: "{{{{ marker_dir }}}}/{{{{ inventory_hostname }}}}.txt"
        mode: "0644"
    - name: Read a secret
      ansible.builtin.command: echo {SECRET}
      changed_when: false
      no_log: true
    - name: Skip on purpose
      ansible.builtin.debug:
        msg: never
      when: false
    - name: Publish the endpoint and what vLLM reported at start-up (as roles/vllm_service does)
      ansible.builtin.set_fact:
        gpufleet_endpoint: "http://10.0.0.1:8000/v1"
        gpufleet_vllm_facts: >-
          {{{{ lookup('ansible.builtin.file', '{VLLM_LOG}') | gpufleet_vllm_facts(16)
             | combine({{'served_model_name': 'tiny', 'executor': 'uni'}}) }}}}
        cacheable: true
      when: inventory_hostname == 'node-a'
""",
    # node-a fails a task with stderr; node-b fails a no_log task holding a secret; an ignored and a
    # rescued failure come first and must not count.
    "failed": f"""
- name: Cluster (recorded)
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Fail but ignore it
      ansible.builtin.command: "false"
      changed_when: false
      ignore_errors: true  # noqa: ignore-errors
    - name: Fail inside a block that rescues
      block:
        - name: Fail and be rescued
          ansible.builtin.fail:
            msg: rescued failure
      rescue:
        - name: Rescue
          ansible.builtin.debug:
            msg: rescued
    - name: Start Ray on node-a
      ansible.builtin.command:
        argv: [sh, -c, 'echo "ray: port 6379 already in use" >&2; exit 3']
      changed_when: false
      when: inventory_hostname == 'node-a'
    - name: Log in with the secret on node-b
      ansible.builtin.command: sh -c 'echo {SECRET} >&2; exit 4'
      changed_when: false
      no_log: true
      when: inventory_hostname == 'node-b'
""",
    "unreachable": """
- name: Reach a host that does not answer (recorded)
  hosts: unreachable
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
""",
    "syntax_error": """
- name: A broken playbook (recorded)
  hosts: gpu_nodes
  tasks:
    - name: Bad module arguments
      ansible.builtin.copy: {content: x, dest: /tmp/x
""",
}


def record(name: str, playbook: str, work: Path) -> list[dict[str, Any]]:
    project = work / name
    (project / "playbooks").mkdir(parents=True)
    (project / "playbooks" / f"{name}.yml").write_text(playbook, encoding="utf-8")
    inventory = work / "hosts.ini"
    inventory.write_text(INVENTORY, encoding="utf-8")
    events: list[dict[str, Any]] = []

    def keep(event: dict[str, Any]) -> bool:
        events.append(event)
        return False

    with tempfile.TemporaryDirectory() as private:
        runner = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(project),
            playbook=f"playbooks/{name}.yml",
            inventory=str(inventory),
            extravars={"marker_dir": str(work)},
            envvars={
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FILTER_PLUGINS": str(REPO / "plugins" / "filter"),
                "PATH": f"{Path(PYTHON).parent}:{os.environ['PATH']}",
            },
            quiet=True,
            json_mode=True,
            event_handler=keep,
            settings={"suppress_ansible_output": True},
        )
        print(f"{name}: status={runner.status} rc={runner.rc} events={len(events)}")
    return events


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        for name, playbook in PLAYBOOKS.items():
            events = record(name, playbook, Path(work))
            target = HERE / f"{name}.json"
            target.write_text(json.dumps(events, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
