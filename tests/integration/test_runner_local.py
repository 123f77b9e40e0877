"""deploy(), status() and teardown() with real ansible-runner and ansible-playbook, on this machine.

A small project of the same shape as gpufleet's (site.yml, roles/, playbooks/<stage>.yml) runs against
two inventory hosts that are both this machine (``ansible_connection=local``); no lab is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from gpufleet.runner import STAGES, DeployReport, deploy, status, teardown
from gpufleet.runner.progress import LiveProgress, print_deploy_report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SECRET = "sk-gpufleet-test-7f3a91"
REPO = Path(__file__).parents[2]
VLLM_LOG = REPO / "tests" / "unit" / "data" / "vllm_logs" / "v0.10.1_v1_debug_full.log"
CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"

PLAYBOOKS = {
    "preflight": """
- name: Preflight (test)
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Check that the caller's environment did not reach ansible-playbook
      ansible.builtin.assert:
        that: lookup('ansible.builtin.env', 'GPUFLEET_TEST_CALLER_SECRET') == ''
        fail_msg: GPUFLEET_TEST_CALLER_SECRET leaked into ansible-playbook's environment
    - name: Write the node marker
      ansible.builtin.copy:
        content: "{{ inventory_hostname }}\\n"
        dest: "{{ marker_dir }}/{{ inventory_hostname }}.txt"
        mode: "0644"
""",
    "nodes": """
- name: Nodes (test)
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Check the bundle directory when one is given
      ansible.builtin.stat:
        path: "{{ gpufleet_bundle_dir }}/bundle.lock.yml"
      register: __test_lock
      when: gpufleet_bundle_dir is defined
    - name: Require the bundle lock
      ansible.builtin.assert:
        that: __test_lock.stat.exists
        fail_msg: no bundle.lock.yml in gpufleet_bundle_dir
      when: gpufleet_bundle_dir is defined
""",
    "artifacts": """
- name: Artifacts (test)
  hosts: gpu_nodes
  gather_facts: false
  tasks: []
""",
    "cluster": """
- name: Cluster (test)
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Wait for the Ray cluster (long when asked)
      ansible.builtin.command: sleep 120
      changed_when: false
      when: slow_cluster | default(false) | bool
""",
    "serve": """
- name: Serve (test)
  hosts: ray_head
  gather_facts: false
  tasks:
    - name: Configure the API key
      ansible.builtin.command: "echo {{ api_key }}"
      changed_when: false
      no_log: true
    - name: Publish the endpoint and what vLLM reported at start-up (as roles/vllm_service does)
      ansible.builtin.set_fact:
        gpufleet_endpoint: "http://127.0.0.1:8000/v1"
        gpufleet_vllm_facts: >-
          {{ lookup('ansible.builtin.file', vllm_log) | gpufleet_vllm_facts(16)
             | combine({'served_model_name': 'tiny', 'executor': 'mp'}) }}
        cacheable: true
""",
    "verify": """
- name: Verify (test)
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Ask the endpoint for its models
      ansible.builtin.command:
        argv: [sh, -c, 'echo "curl: (7) Failed to connect to 127.0.0.1 port 8000" >&2; exit 7']
      changed_when: false
      when: fail_verify | default(false) | bool and inventory_hostname == 'head'
    - name: Call the endpoint with the API key
      ansible.builtin.shell: "echo 'rejected key {{ api_key }}' >&2; exit 1"
      changed_when: false
      no_log: true
      when: fail_verify | default(false) | bool and inventory_hostname == 'worker'
""",
    "status": """
- name: Status (test)
  hosts: ray_head
  gather_facts: false
  tasks:
    - name: Publish what runs
      ansible.builtin.set_fact:
        gpufleet_ray_nodes_alive: "{{ groups['gpu_nodes'] | length }}"
        gpufleet_ray_nodes_expected: "{{ groups['gpu_nodes'] | length }}"
        gpufleet_ray_gpus: 0
        gpufleet_vllm_ready: true
        gpufleet_endpoint: "http://127.0.0.1:8000/v1"
        gpufleet_vllm_facts: "{{ lookup('ansible.builtin.file', vllm_log) | gpufleet_vllm_facts }}"
""",
    "teardown": """
- name: Teardown (test)
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Remove the node marker
      ansible.builtin.file:
        path: "{{ marker_dir }}/{{ inventory_hostname }}.txt"
        state: absent
""",
}


def make_project(root: Path) -> Path:
    (root / "playbooks").mkdir(parents=True)
    (root / "roles").mkdir()
    (root / "site.yml").write_text("[]\n", encoding="utf-8")
    (root / "ansible.cfg").write_text(
        f"[defaults]\ninterpreter_python = auto_silent\nfilter_plugins = {REPO / 'plugins' / 'filter'}\n",
        encoding="utf-8",
    )
    for name, text in PLAYBOOKS.items():
        (root / "playbooks" / f"{name}.yml").write_text(text.lstrip(), encoding="utf-8")
    return root


def make_inventory(path: Path, markers: Path) -> Path:
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    path.write_text(
        f"[ray_head]\nhead {local}\n[ray_workers]\nworker {local}\n"
        "[gpu_nodes:children]\nray_head\nray_workers\n"
        f"[gpu_nodes:vars]\nmarker_dir={markers}\napi_key={SECRET}\nvllm_log={VLLM_LOG}\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "project")


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


@pytest.fixture
def inventory(tmp_path: Path, markers: Path) -> Path:
    return make_inventory(tmp_path / "hosts.ini", markers)


@pytest.fixture(scope="module")
def two_deploys(tmp_path_factory: pytest.TempPathFactory) -> tuple[DeployReport, DeployReport, Path]:
    """Every stage twice on the same hosts, with a secret in the caller's environment."""
    work = tmp_path_factory.mktemp("deploy")
    project = make_project(work / "project")
    markers = work / "markers"
    markers.mkdir()
    inventory = make_inventory(work / "hosts.ini", markers)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("GPUFLEET_TEST_CALLER_SECRET", "must-not-reach-ansible")
        return run(project, inventory), run(project, inventory), markers


def run(project: Path, inventory: Path, **options: object) -> DeployReport:
    return deploy(inventory, project_dir=project, validate_inventory=False, **options)  # type: ignore[arg-type]


def changed(report: DeployReport) -> dict[str, int]:
    return {stage.name: sum(host.changed for host in stage.hosts) for stage in report.stages}


def test_a_deploy_runs_every_stage_in_order_and_reports_what_serve_published(
    two_deploys: tuple[DeployReport, DeployReport, Path],
) -> None:
    report, _, markers = two_deploys

    assert report.ok, report.model_dump_json(indent=2)
    # every stage but the optional monitoring, which this inventory does not turn on (gpufleet_monitoring)
    assert [stage.name for stage in report.stages] == [name for name in STAGES if name != "monitoring"]
    assert changed(report) == {
        "preflight": 2,
        "nodes": 0,
        "artifacts": 0,
        "cluster": 0,
        "serve": 0,
        "verify": 0,
    }
    assert sorted(path.name for path in markers.iterdir()) == ["head.txt", "worker.txt"]
    preflight = report.stages[0]
    assert [(host.host, host.ok, host.changed) for host in preflight.hosts] == [
        ("head", 2, 1),
        ("worker", 2, 1),
    ]
    assert (report.endpoint, report.served_model) == ("http://127.0.0.1:8000/v1", "tiny")
    assert report.vllm is not None
    assert (report.vllm.weights_gib, report.vllm.kv_cache_tokens, report.vllm.max_concurrency) == (
        2.3185,
        1215552,
        9.27,
    )
    assert report.vllm.ready_seconds == 27.0


def test_a_second_run_changes_nothing(two_deploys: tuple[DeployReport, DeployReport, Path]) -> None:
    _, again, _ = two_deploys

    assert again.ok
    assert set(changed(again).values()) == {0}


def test_check_mode_reports_changes_without_making_them(
    project: Path, inventory: Path, markers: Path
) -> None:
    report = run(project, inventory, stages=["preflight"], check=True)

    assert report.ok and report.check_mode
    assert changed(report) == {"preflight": 2}
    assert list(markers.iterdir()) == []


def test_bundle_and_limit_reach_the_playbooks(
    project: Path, inventory: Path, markers: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.lock.yml").write_text("files: []\n", encoding="utf-8")

    report = run(project, inventory, stages=["preflight", "nodes"], bundle=bundle, limit="worker")

    assert report.ok, report.model_dump_json(indent=2)
    assert [host.host for host in report.stages[1].hosts] == ["worker"]
    assert [path.name for path in markers.iterdir()] == ["worker.txt"]


def test_a_failing_stage_stops_the_run_and_names_host_task_and_message(
    project: Path, inventory: Path
) -> None:
    output = StringIO()
    console = Console(file=output, width=250)

    with LiveProgress(console) as live:
        report = run(
            project, inventory, stages=["serve", "verify"], extra_vars={"fail_verify": True}, progress=live
        )
    print_deploy_report(console, report)

    assert not report.ok
    assert report.failed_stage == "verify"
    failures = [(f.stage, f.host, f.task, f.message) for f in report.failures]
    assert failures == [
        (
            "verify",
            "head",
            "Ask the endpoint for its models",
            "non-zero return code (rc 7): curl: (7) Failed to connect to 127.0.0.1 port 8000",
        ),
        ("verify", "worker", "Call the endpoint with the API key", CENSORED),
    ]
    assert [(h.host, h.failed) for h in report.stages[-1].hosts] == [("head", 1), ("worker", 1)]
    text = output.getvalue()
    assert "FAILED verify · head · Ask the endpoint for its models: non-zero return code (rc 7)" in text
    assert "failed in stage verify" in text
    # The no_log tasks' values (the API key) appear nowhere: not in the report, not on the screen.
    assert SECRET not in report.model_dump_json()
    assert SECRET not in text


def test_a_failure_stops_the_later_stages(project: Path, inventory: Path, markers: Path) -> None:
    (project / "playbooks" / "nodes.yml").write_text(
        "- hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n"
        "    - name: Install the driver\n      ansible.builtin.fail:\n        msg: no kernel headers\n",
        encoding="utf-8",
    )

    report = run(project, inventory, stages=["nodes", "artifacts"])

    assert [(stage.name, stage.status) for stage in report.stages] == [("nodes", "failed")]
    assert {failure.message for failure in report.failures} == {"no kernel headers"}


def test_a_canceled_run_stops_the_playbook(project: Path, inventory: Path) -> None:
    started = time.monotonic()

    report = run(
        project,
        inventory,
        stages=["cluster", "serve"],
        extra_vars={"slow_cluster": True},
        cancel=lambda: time.monotonic() - started > 8,
    )

    assert time.monotonic() - started < 60
    assert [(stage.name, stage.status) for stage in report.stages] == [("cluster", "canceled")]
    assert report.failed_stage == "cluster"


def test_status_reads_what_the_status_playbook_published(project: Path, inventory: Path) -> None:
    report = status(inventory, project_dir=project)

    assert report.ok
    assert (report.ray_nodes_alive, report.ray_nodes_expected, report.vllm_ready) == (2, 2, True)
    assert report.vllm is not None and report.vllm.kv_cache_gib == 37.10


def test_teardown_runs_its_playbook(project: Path, inventory: Path, markers: Path) -> None:
    assert run(project, inventory, stages=["preflight"]).ok

    report = teardown(inventory, project_dir=project)

    assert report.ok
    assert changed(report) == {"teardown": 2}
    assert list(markers.iterdir()) == []


def test_gpufleet_status_prints_one_json_object(project: Path, inventory: Path) -> None:
    script = "import sys; from gpufleet.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {"GPUFLEET_HOME": str(project), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}

    done = subprocess.run(
        [sys.executable, "-c", script, "status", "-i", str(inventory), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["ok"], report["ray_nodes_alive"], report["endpoint"]) == (
        True,
        2,
        "http://127.0.0.1:8000/v1",
    )
