"""The air-gapped end-to-end deployment: every stage, for real, from the lab bundle onto the session lab.

The session lab is offline (hosts reach each other and this machine's bridge address only). The module
gives its three hosts fresh root file systems, and each a default route to the bridge, where the lab's DROP
rules drop and count anything meant for beyond the lab. Then ``deploy()`` runs preflight, nodes, artifacts,
cluster, serve and verify from the bundle (Docker 20.10 from Debian's packages, the CPU serving image, the
tiny model), and a second ``deploy()`` must change nothing. Both deploys are ``gpufleet deploy --json`` of
the wheel built from this checkout and installed into a fresh venv outside it, run from a directory
outside it: they prove the wheel (its collection, its plugins, its ansible.cfg), not the checkout. At the
end the hosts are reset again, so that later tests find them fresh.

The bundle is the session's ``lab_bundle`` (conftest.py: :func:`gpufleet.lab.demo.build_lab_bundle` into
``~/.cache/gpufleet/lab-bundle``, re-checked against this checkout; the serving image comes from
``~/.cache/gpufleet/serving-image``).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cancel_support import CANCEL_SECONDS, Canceled, cancel_mid_artifacts, cgroups_available, images_on
from conftest import REPO, VENV_BIN, RunningLab, installed_env, run_installed, run_playbook
from migration_support import (
    INSTANCE_FILES,
    LEGACY_FILES,
    LEGACY_UNIT,
    present,
    previous_release,
    serve_with,
)
from services_support import (
    BROKEN,
    EDGE_PORT,
    IMAGE,
    PROMETHEUS_PORT,
    ROUTER_PORT,
    SERVICES_DASHBOARD,
    UPGRADE,
    all_queries,
    empty_panels,
    failures,
    prometheus,
    ray_started,
    replica_revision,
)
from tests.monitoring_assets import ALERT_NAMES, dashboards, metric_names, render_rules

from gpufleet.lab.demo import PROMPT, api_key_file, chat, lab_plan, route_to_bridge
from gpufleet.lab.net import outbound_drops
from gpufleet.lab.upgrade import BROKEN_MESSAGE, image_id, make_images
from gpufleet.runner import STAGES, DeployReport, deploy, status, teardown
from gpufleet.vllm_log import compare

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]

VLLM_UNIT = "gpufleet-vllm@default.service"  # today's one service: instance `default`


@dataclass(frozen=True)
class Deployment:
    inventory: Path
    bundle: Path
    first: DeployReport
    second: DeployReport
    outbound_packets: int
    canceled: Canceled | None  # the first deploy, interrupted mid-artifacts (None without a pids cgroup)

    @property
    def key(self) -> str:
        return api_key_file(self.inventory).read_text(encoding="utf-8").strip()


def deploy_args(inventory: Path, bundle: Path, *more: str) -> list[str]:
    """The arguments of the module's `gpufleet deploy --json` (with ``more`` arguments)."""
    return [
        "deploy",
        "-i",
        str(inventory),
        "--bundle",
        str(bundle),
        "-e",
        "gpufleet_monitoring=true",  # the optional stage, on as in inventories/prod
        *more,
        "--json",
    ]


def deploy_from_wheel(installed: Path, inventory: Path, bundle: Path, cwd: Path, *more: str) -> DeployReport:
    """`gpufleet deploy --json` of the installed wheel (with ``more`` arguments); its report, parsed."""
    run = run_installed(installed, *deploy_args(inventory, bundle, *more), cwd=cwd, timeout=3000)
    assert run.stdout.strip(), (
        f"gpufleet deploy printed no report (exit {run.returncode}): {run.stderr[-3000:]}"
    )
    return DeployReport.model_validate_json(run.stdout)


def rollback_from_wheel(
    installed: Path, inventory: Path, cwd: Path
) -> tuple[subprocess.CompletedProcess[str], DeployReport]:
    """`gpufleet rollback --json` (previous) of the installed wheel; the run and its report, parsed."""
    run = run_installed(installed, "rollback", "-i", str(inventory), "--json", cwd=cwd, timeout=1200)
    assert run.stdout.strip(), f"gpufleet rollback printed no report (exit {run.returncode}): {run.stderr}"
    return run, DeployReport.model_validate_json(run.stdout)


@pytest.fixture(scope="module")
def deployment(
    lab: RunningLab, lab_bundle: Path, installed_gpufleet: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    inventory = lab.lab.reset().inventory
    route_to_bridge(lab.lab, lab.inventory)
    before = outbound_drops(lab.inventory.name)
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # not the checkout: nothing found relative to it
    try:
        canceled = None
        if cgroups_available():  # the same deploy, interrupted mid-artifacts first (cancel_support.py)
            argv = [str(installed_gpufleet / "gpufleet"), *deploy_args(inventory, lab_bundle)]
            env = installed_env(installed_gpufleet)
            canceled = cancel_mid_artifacts(lab, inventory, lab_bundle, argv, cwd=elsewhere, env=env)
        first = deploy_from_wheel(installed_gpufleet, inventory, lab_bundle, elsewhere)
        second = (
            deploy_from_wheel(installed_gpufleet, inventory, lab_bundle, elsewhere) if first.ok else first
        )
        dropped = outbound_drops(lab.inventory.name) - before
        print(f"e2e: first deploy {first.seconds:.0f} s, second {second.seconds:.0f} s; dropped {dropped}")
        print("e2e: first deploy's stages: " + ", ".join(f"{s.name} {s.seconds:.0f} s" for s in first.stages))
        yield Deployment(inventory, lab_bundle, first, second, dropped, canceled)
    finally:  # the next module needs the hosts, not the deleted layers of this one's images (issue 33)
        lab.lab.reset(wait=False)


def test_the_first_deploy_runs_every_stage(deployment: Deployment) -> None:
    report = deployment.first
    assert report.ok, failures(report)
    assert [stage.name for stage in report.stages] == list(STAGES)
    # verify's checks run on the head, then every node records its revision and installs the fleet check
    # (playbooks/fleet_record.yml); serve on every node (the workers' tasks skip with the Ray executor)
    assert {stage.name: len(stage.hosts) for stage in report.stages} == dict.fromkeys(STAGES, 3)
    verify = next(stage for stage in report.stages if stage.name == "verify")
    assert {host.host: host.changed for host in verify.hosts} == dict.fromkeys(["node1", "node2", "node3"], 2)
    assert report.changed > 0


def test_the_second_deploy_changes_nothing(deployment: Deployment) -> None:
    report = deployment.second
    assert report.ok, failures(report)
    changed = {f"{s.name}/{h.host}": h.changed for s in report.stages for h in s.hosts if h.changed}
    assert changed == {}


def test_sigint_mid_artifacts_stops_every_process_and_the_next_deploy_completes(
    deployment: Deployment,
) -> None:
    """Cancel means stopped (issue 13 item 3): gpufleet exits within CANCEL_SECONDS with a canceled report; no
    process of the run is left on this machine nor on the hosts (no docker load, no relay, no Ansible task or
    async job); the fleet lock and the head's run marker are gone; the next deploy (the first above) completes
    from where the cancel left the hosts."""
    canceled = deployment.canceled
    if canceled is None:
        pytest.skip("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
    assert canceled.returncode == 130, canceled.stderr[-3000:]
    report = json.loads(canceled.stdout)
    assert [stage["status"] for stage in report["stages"]][-1] == "canceled", report
    assert report["stages"][-1]["name"] == "artifacts", report
    assert canceled.took <= CANCEL_SECONDS, f"stopped after {canceled.took:.2f} s"
    assert canceled.left_here == [], canceled.left_here
    assert canceled.left_there == {}, canceled.left_there
    assert canceled.lock_busy == "", canceled.lock_busy
    assert canceled.marker == "", f"the run's marker is still on the head: {canceled.marker}"
    assert deployment.first.ok, failures(deployment.first)


def test_every_host_holds_each_image_of_the_bundle_once_with_its_pinned_id(
    lab: RunningLab, deployment: Deployment
) -> None:
    """After a cancel mid-transfer and the deploys that followed: no image twice, none under another ID."""
    lock = yaml.safe_load((deployment.bundle / "bundle.lock.yml").read_text(encoding="utf-8"))
    for host in lab.hosts:
        images = images_on(lab, host)
        for image in lock["images"]:
            name = f"{image['name']}:{image['tag']}"
            assert [entry for entry in images if entry[0] == name] == [(name, image["id"])], (host, images)


def tasks_run(report: DeployReport) -> dict[str, int]:
    return {f"{s.name}/{h.host}": h.ok + h.failed + h.skipped for s in report.stages for h in s.hosts}


def test_the_second_deploy_checks_each_node_once_and_skips_every_stage_but_verify(
    deployment: Deployment,
) -> None:
    """Issue 15: every node still as the first deploy left it, one check per node (playbooks/fleet_check.yml:
    every role's stamp and the deployment's inputs) and the stages from preflight to serve run no task on any
    host; verify's checks still run on the head. changed=0 alone would also hold for a slow re-run."""
    first, second = tasks_run(deployment.first), tasks_run(deployment.second)
    skipped = {s.name: (s.in_sync, len(s.hosts)) for s in deployment.second.stages}
    assert {name: skipped[name] for name in ("nodes", "artifacts", "cluster", "serve")} == dict.fromkeys(
        ("nodes", "artifacts", "cluster", "serve"), (True, 0)
    ), skipped
    checks = {key: count for key, count in second.items() if key.startswith("preflight/")}
    assert len(checks) == 3 and max(checks.values()) <= 3, checks  # the check, the digest, the group
    assert [key for key in second if key.startswith("verify/")] == ["verify/node1"]
    assert second["verify/node1"] <= first["verify/node1"]
    # the report says why a whole deploy ran every stage: on the first one, no node had a deploy recorded
    nodes = {host.host for host in deployment.first.stages[0].hosts}
    assert len(nodes) == 3 and deployment.second.not_in_sync == {}, deployment.second.not_in_sync
    first_why = dict.fromkeys(sorted(nodes), "no whole deploy recorded on this node yet")
    assert deployment.first.not_in_sync == first_why, deployment.first.not_in_sync


# Runs on a node (python3 - on stdin): the fleet check's copy of gpufleet_converged answers each docker CLI
# question the roles fingerprint from dockerd's API; print what it says and what the CLI itself says.
_DOCKER_ANSWERS = r"""
import hashlib, importlib.machinery, importlib.util, json, subprocess
loader = importlib.machinery.SourceFileLoader("converged", "/usr/local/libexec/gpufleet-converged")
spec = importlib.util.spec_from_loader("converged", loader)
converged = importlib.util.module_from_spec(spec)
loader.exec_module(converged)
ids = ["docker", "image", "inspect", "--format", "{{.Id}}"]
questions = [
    ids + ["gpufleet/busybox:1.35.0", "gpufleet/vllm-cpu:0.32.0"],
    ["/usr/local/bin/docker"] + ids[1:] + ["gpufleet/vllm-cpu:0.32.0"],
    ids + ["gpufleet/absent:0", "gpufleet/busybox:1.35.0"],
    ["docker", "info", "--format", "{{json .Runtimes}}"],
]
for argv in questions:
    api = converged.docker_answer(argv)
    cli = subprocess.run(argv, capture_output=True, check=False)
    print(json.dumps({
        "argv": " ".join(argv[1:]),
        "api": None if api is None else [api[0], api[1].decode()],
        "cli": [cli.returncode, cli.stdout.decode()],
        "state": converged.command_state(argv),
        "cli_state": "%d %s" % (cli.returncode, hashlib.sha256(cli.stdout).hexdigest()),
    }))
"""


def test_the_fleet_check_reads_dockers_answers_from_its_api_as_the_cli_gives_them(
    lab: RunningLab, deployment: Deployment
) -> None:
    """Issue 15: the fleet check asks dockerd over its socket instead of running the docker CLI (a third of
    its cost on a node); the answer must be the CLI's byte for byte, present, missing and runtimes alike, or
    stamps recorded one way would not hold the other (a needless converge, or a drift not seen)."""
    ran = lab.lab.ssh(lab.hosts[1], ["python3", "-"], stdin=_DOCKER_ANSWERS)
    assert ran.returncode == 0, ran.stderr
    answers = [json.loads(line) for line in ran.stdout.splitlines()]
    assert len(answers) == 4, ran.stdout
    for answer in answers:
        assert answer["api"] is not None, f"{answer['argv']}: the CLI ran, not the API"
        assert answer["api"] == answer["cli"], answer
        assert answer["state"] == answer["cli_state"], answer
    assert answers[2]["cli"][0] == 1 and answers[2]["cli"][1].startswith("sha256:"), answers[2]
    assert '"runc"' in answers[3]["cli"][1], answers[3]


# A login with sudo, as most fleets have (the lab logs in as root): the same SSH key, sudo without a password.
_SUDO_LOGIN = (
    "useradd -m -s /bin/bash deployer && install -d -m 700 -o deployer -g deployer ~deployer/.ssh"
    " && install -m 600 -o deployer -g deployer /root/.ssh/authorized_keys ~deployer/.ssh/"
    " && echo 'deployer ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/deployer"
    " && chmod 440 /etc/sudoers.d/deployer"
)


def test_a_login_that_is_not_root_deploys_through_sudo(
    lab: RunningLab, deployment: Deployment, installed_gpufleet: Path, tmp_path: Path
) -> None:
    """Most fleets log in as a user with sudo, not as root. The fast path gives way when one node differs:
    with node2 drifted, a whole deploy through such a login finds it in node2's fleet check (the report says
    what), runs every stage's checks on every node through sudo, and each role's own check converges only
    what drifted (the docker role on node2); the next one takes the fast path again, each node's fleet
    check running the node's copy of the module under sudo (not Ansible's module wrapper, which would also
    answer). The login user is not part of the deployment: nothing else changes. (This test also holds
    what a separate whole deploy with one node drifted, as root, asserted before; it runs on the fleet the
    second deploy left in sync. It holds what the test of a nodes-only run with one node drifted asserted
    before, too: the drifted role converges there and every other role skips its tasks by its own stamp.)"""
    since = lab.ssh(lab.hosts[0], "date +%s").stdout.strip()
    login = ("-e", "ansible_user=deployer")
    as_deployer = (installed_gpufleet, deployment.inventory, deployment.bundle, tmp_path, *login)
    try:
        for host in lab.hosts:
            made = lab.ssh(host, _SUDO_LOGIN)
            assert made.returncode == 0, made.stderr
        lab.ssh(lab.hosts[1], ["rm", "/etc/sysctl.d/90-docker.conf"])
        report = deploy_from_wheel(*as_deployer)
        assert report.ok, failures(report)
        assert not any(stage.in_sync for stage in report.stages)
        assert report.not_in_sync == {
            "node2": "fleet: docker: /etc/sysctl.d/90-docker.conf changed since the last converge"
        }, report.not_in_sync
        assert {f"{s.name}/{h.host}": h.changed for s in report.stages for h in s.hosts if h.changed} == {
            "nodes/node2": 1
        }
        assert lab.ssh(lab.hosts[1], ["test", "-s", "/etc/sysctl.d/90-docker.conf"]).returncode == 0
        # only the drifted role converged: every role of the stage found its own stamp and skipped its
        # tasks, but the docker role on node2, which ran more than twice the tasks of a node that skipped all
        ran = tasks_run(report)
        assert ran["nodes/node2"] > 2 * max(ran["nodes/node1"], ran["nodes/node3"]), ran
        again = deploy_from_wheel(*as_deployer)
        assert again.ok and again.changed == 0, failures(again)
        assert [s.name for s in again.stages if s.in_sync] == ["nodes", "artifacts", "cluster", "serve"]
        assert again.verify is not None and again.verify.unauthorized_status == 401, again.verify
        for host in lab.hosts:
            said = lab.ssh(host, f"journalctl -q --no-pager _COMM=sudo --since @{since}").stdout
            fleet_check = [line for line in said.splitlines() if "gpufleet-converged --fleet-check" in line]
            assert len(fleet_check) == 2, said  # both runs' checks, through sudo
            assert "deployer" in fleet_check[0] and "USER=root" in fleet_check[0], fleet_check
    finally:
        for host in lab.hosts:
            lab.ssh(host, "rm -f /etc/sudoers.d/deployer; pkill -u deployer; userdel -r deployer")


def test_no_host_sent_anything_beyond_the_lab(deployment: Deployment) -> None:
    assert deployment.outbound_packets == 0


def test_ray_sees_three_nodes_and_vllm_is_ready(deployment: Deployment) -> None:
    report = status(deployment.inventory)

    assert report.stage.status == "ok", report.stage
    assert (report.ray_nodes_alive, report.ray_nodes_expected) == (3, 3)
    assert report.vllm_ready
    assert report.ok
    assert report.endpoint == deployment.first.endpoint
    # the operator's view: the load from the monitoring stage's Prometheus, and what each node runs
    assert report.load is not None and report.load.source == "prometheus", report.load
    assert report.load.requests_running == 0 and report.load.kv_cache_usage is not None, report.load
    assert len({node.image_id for node in report.nodes}) == 1 and report.nodes[0].image_id, report.nodes
    assert {node.model_revision for node in report.nodes} == {report.nodes[0].model_revision}, report.nodes
    assert [node.host for node in report.nodes if node.config_sha256] == [report.nodes[0].host]  # the head


def test_the_executor_auto_chose_ray_for_an_image_with_ray(lab: RunningLab, deployment: Deployment) -> None:
    """vllm_service_executor is left at its default (auto); the lab's image has Ray, so Ray serves: the head's
    vLLM unit says so, and Ray (not an idle container) runs on every node."""
    assert deployment.first.ok
    head = lab.hosts[0]
    unit = lab.ssh(head, ["systemctl", "show", "--property=Description", "--value", VLLM_UNIT])
    # TP 1: vLLM runs its own in-process executor in the Ray head's container (no Ray worker for one device)
    assert "uni executor) in container gpufleet-ray with Ray" in unit.stdout, unit.stdout
    for host in lab.hosts:
        container = lab.ssh(host, ["systemctl", "cat", "gpufleet-ray.service"])
        started = "--entrypoint=ray" in container.stdout and "sleep" not in container.stdout
        assert started, (host, container.stdout)


def test_rays_ports_answer_the_nodes_but_not_other_hosts(lab: RunningLab, deployment: Deployment) -> None:
    """The ray_cluster firewall: the control node (on the lab network, not a node of the fleet) is dropped
    on every Ray port of the head, while a worker still reaches the head's GCS."""
    head, worker = lab.inventory.hosts[0], lab.inventory.hosts[1]
    for port in (6379, 6380, 10001):
        with pytest.raises(OSError):
            socket.create_connection((head.ip, port), timeout=3).close()
    probe = f"import socket; socket.create_connection(('{head.ip}', 6379), 5).close(); print('reached')"
    reached = lab.ssh(worker.name, ["python3", "-c", probe])
    assert reached.returncode == 0 and "reached" in reached.stdout, reached.stderr
    rules = lab.ssh(head.name, ["iptables", "-S", "GPUFLEET-RAY"])
    assert f"-s {worker.ip}/32 -j RETURN" in rules.stdout, rules.stdout


def test_a_completion_with_the_key_is_deterministic(deployment: Deployment) -> None:
    endpoint, model = deployment.first.endpoint, deployment.first.served_model
    assert endpoint and model == "tiny"

    first_status, first = chat(endpoint, deployment.key, model)
    second_status, second = chat(endpoint, deployment.key, model)

    assert first_status == second_status == 200
    assert first["usage"]["completion_tokens"] > 0
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def test_the_verify_stage_got_the_same_completion(deployment: Deployment) -> None:
    verify = deployment.first.verify
    assert verify is not None
    _, body = chat(deployment.first.endpoint or "", deployment.key, "tiny")

    assert verify.completion == body["choices"][0]["message"]["content"]
    assert (verify.unauthorized_status, verify.metrics) == (401, True)


def test_a_request_without_the_key_is_refused(deployment: Deployment) -> None:
    code, _ = chat(deployment.first.endpoint or "", None, "tiny")

    assert code == 401


def test_the_key_is_not_in_the_report(deployment: Deployment) -> None:
    assert deployment.key not in deployment.first.model_dump_json()
    assert deployment.key not in deployment.second.model_dump_json()


def test_vllms_facts_match_the_plan_within_ten_percent(deployment: Deployment) -> None:
    facts = deployment.first.vllm
    plan = lab_plan(deployment.inventory, deployment.bundle)
    assert facts is not None and facts.kv_cache_tokens is not None

    assert compare(facts, plan) == []
    assert facts.kv_cache_tokens == plan.kv_cache_tokens  # the CPU build's KV cache is set, not measured
    assert deployment.first.compared_with(plan).warnings == ()


# ----- monitoring (the optional stage, on in these deploys): Prometheus on the head, node_exporter everywhere
# Queried by the dashboards as fallbacks for older vLLM releases, absent from the lab's (current) vLLM.
LEGACY_VLLM_NAMES = {
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_hit_rate",
    "vllm:time_per_output_token_seconds_bucket",
}


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(render_rules({}))["groups"]
    return [str(rule["expr"]) for group in groups for rule in group["rules"]]


def test_prometheus_reports_every_target_up_on_the_cluster_address(
    lab: RunningLab, deployment: Deployment
) -> None:
    head = lab.inventory.hosts[0]
    targets = prometheus(head.ip, "/api/v1/targets", state="active")["activeTargets"]
    seen = sorted((t["labels"]["job"], t["labels"]["node"], t["health"]) for t in targets)
    nodes = [host.name for host in lab.inventory.hosts]
    expected = sorted(
        [("prometheus", head.name, "up"), ("vllm", head.name, "up")]
        + [(job, node, "up") for job in ("node", "ray") for node in nodes]
    )
    assert seen == expected, [t.get("lastError") for t in targets]
    listening = lab.ssh(head.name, ["ss", "-Hltn", f"sport = :{PROMETHEUS_PORT}"]).stdout.split()
    assert f"{head.ip}:{PROMETHEUS_PORT}" in listening and f"0.0.0.0:{PROMETHEUS_PORT}" not in listening, (
        listening
    )


def test_the_alert_rules_pass_promtool_and_prometheus_loaded_them(
    lab: RunningLab, deployment: Deployment
) -> None:
    head = lab.inventory.hosts[0]
    promtool = lab.ssh(
        head.name,
        [
            "sh",
            "-c",
            "/opt/gpufleet/monitoring/*/prometheus-*/promtool check rules "
            "/etc/gpufleet/monitoring/rules/gpufleet-alerts.rules.yml",
        ],
    )
    assert promtool.returncode == 0 and "SUCCESS: 6 rules found" in promtool.stdout, (
        promtool.stdout + promtool.stderr
    )
    groups = prometheus(head.ip, "/api/v1/rules")["groups"]
    alerts = {rule["name"] for group in groups for rule in group["rules"] if rule["type"] == "alerting"}
    assert alerts == ALERT_NAMES
    assert all(rule.get("health") == "ok" for group in groups for rule in group["rules"]), groups


def test_the_vllm_metrics_the_dashboards_query_exist_in_the_lab_vllm(
    lab: RunningLab, deployment: Deployment
) -> None:
    """A vLLM upgrade that renames a metric the dashboards or alerts use fails here, not later in Grafana."""
    head = lab.inventory.hosts[0]
    with urllib.request.urlopen(f"http://{head.ip}:8000/metrics", timeout=30) as response:
        exposed = {
            line.split("{")[0].split()[0]
            for line in response.read().decode().splitlines()
            if line[:1] not in ("#", "")
        }
    queried = {name for _, expr in all_queries() for name in metric_names(expr) if name.startswith("vllm:")}
    queried |= {name for expr in rule_exprs() for name in metric_names(expr) if name.startswith("vllm:")}
    assert queried - LEGACY_VLLM_NAMES <= exposed, sorted(queried - LEGACY_VLLM_NAMES - exposed)
    assert queried >= LEGACY_VLLM_NAMES  # both generations are queried (older vLLM images still serve)


def test_every_dashboard_query_returns_data_from_the_lab_prometheus(
    lab: RunningLab, deployment: Deployment
) -> None:
    """Every panel of the vLLM and node dashboards, evaluated by the lab's Prometheus after a little traffic,
    returns at least one finite value. dcgm-exporter's panels are checked for syntax only: no GPU here."""
    head = lab.inventory.hosts[0]
    for prompt in ("one", "two", "three", "one"):  # the repeated prompt hits the prefix cache
        assert chat(f"http://{head.ip}:8000/v1", deployment.key, "tiny", prompt)[0] == 200
    time.sleep(2 * 5 + 2)  # two scrapes (the lab scrapes every 5 s) so that rate() sees the requests
    assert empty_panels(head.ip, frozenset(dashboards()) - {SERVICES_DASHBOARD}) == []


GRAFANA_DOUBLE = "gpufleet/grafana-double:lab"


def test_grafana_serves_the_provisioned_dashboards_to_the_admin_only(
    lab: RunningLab, deployment: Deployment
) -> None:
    """The role's Grafana path (image check, generated password, provisioning, unit, health wait) with
    the lab's TEST DOUBLE of Grafana (tests/doubles/grafana_double.py, built on the head from the serving
    image) in the place of grafana/grafana-oss, which no registry these machines reach carries."""
    head = lab.inventory.hosts[0]
    script = base64.b64encode((REPO / "tests" / "doubles" / "grafana_double.py").read_bytes()).decode()
    dockerfile = (
        f"FROM {IMAGE}\nCOPY grafana_double.py /usr/local/bin/\n"
        'ENTRYPOINT ["/opt/vllm/bin/python", "/usr/local/bin/grafana_double.py"]\n'
    )
    build = (
        "mkdir -p /tmp/grafana-double && cd /tmp/grafana-double"
        f" && echo {script} | base64 -d > grafana_double.py && printf '{dockerfile}' > Dockerfile"
        f" && docker build -q -t {GRAFANA_DOUBLE} ."
    )
    built = lab.ssh(head.name, ["sh", "-c", build], timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    grafana = {
        "gpufleet_monitoring": True,
        "monitoring_grafana": True,
        "monitoring_grafana_image": GRAFANA_DOUBLE,
    }

    runs = [
        deploy(deployment.inventory, bundle=deployment.bundle, stages=["monitoring"], extra_vars=grafana)
        for _ in range(2)
    ]

    assert all(run.ok for run in runs), [failures(run) for run in runs]
    assert {h.host: h.changed for h in runs[1].stages[0].hosts} == {name: 0 for name in lab.hosts}
    password_file = deployment.inventory.parent / "gpufleet.grafana-password"
    password = password_file.read_text(encoding="utf-8").strip()
    assert password_file.stat().st_mode & 0o777 == 0o600 and len(password) == 32
    assert all(password not in run.model_dump_json() for run in runs)
    url = f"http://{head.ip}:3000/api/search?tag=gpufleet"
    token = base64.b64encode(f"admin:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:  # the lab network only
        found = {dashboard["uid"] for dashboard in json.loads(response.read())}
    assert found == {board["uid"] for board in dashboards().values()}  # the three the role ships
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)  # anonymous access is off
    assert refused.value.code == 401


def test_a_killed_server_leaves_no_orphan_and_the_restarted_one_is_alone(
    lab: RunningLab, deployment: Deployment
) -> None:
    """kill -9 of vLLM's API server in the head's container: systemd restarts the unit, whose control script
    stops what the dead server left (EngineCore, workers); afterwards the service's tree is the only vLLM in
    the container, its control script reports no orphans, and the endpoint answers again."""
    head = lab.inventory.hosts[0]
    ctl = "/etc/gpufleet/instances/default/ctl"
    before = json.loads(lab.ssh(head.name, [ctl, "procs"]).stdout)
    assert before["unit_active"] and before["service"] and before["orphans"] == [], before
    # The server in the container runs /opt/vllm/bin/vllm; the unit's `docker exec ... gpufleet-ray vllm`
    # serve on the host has no "/" before vllm, so this pattern finds the server only.
    (server,) = lab.ssh(head.name, ["pgrep", "-f", "/vllm serve --config"]).stdout.split()
    assert int(server) in before["service"], (server, before)
    killed = lab.ssh(head.name, ["kill", "-KILL", server])
    assert killed.returncode == 0, killed.stderr
    deadline = time.monotonic() + 600
    code = 0
    while time.monotonic() < deadline:
        try:
            code, _ = chat(f"http://{head.ip}:8000/v1", deployment.key, "tiny")
        except (OSError, http.client.HTTPException):  # the port is open while the server restarts
            code = 0
        if code == 200:
            break
        time.sleep(5)
    assert code == 200, "vLLM did not answer again within 600 s of kill -9"
    after = json.loads(lab.ssh(head.name, [ctl, "procs"]).stdout)
    assert after["orphans"] == [], after["orphans"]
    assert after["unit_active"] and set(after["service"]).isdisjoint(before["service"]), (before, after)
    servers = lab.ssh(head.name, ["pgrep", "-f", "/vllm serve --config"]).stdout.split()
    assert len(servers) == 1 and int(servers[0]) in after["service"], (servers, after["service"])


# ----- the gateway's routers (issue 35): vllm-router per service on the head, in front of the deployed vLLM

# On the head: lab.demo.chat through the router on loopback (the key on stdin: never in an argv or a log)
CHAT_ON_HEAD = """
import json, sys, urllib.error, urllib.request
args = json.load(sys.stdin)
headers = {"Content-Type": "application/json"}
if args["key"]:
    headers["Authorization"] = "Bearer " + args["key"]
messages = [{"role": "user", "content": args["prompt"]}]
body = {"model": "tiny", "messages": messages, "max_tokens": 16, "temperature": 0}
request = urllib.request.Request(args["url"], data=json.dumps(body).encode(), headers=headers)
try:
    with urllib.request.urlopen(request, timeout=60) as answer:
        print(json.dumps([answer.status, json.load(answer)["choices"][0]["message"]["content"]]))
except urllib.error.HTTPError as error:
    print(json.dumps([error.code, ""]))
except OSError as error:
    print(json.dumps([0, str(error)]))
"""


def chat_on_head(lab: RunningLab, key: str | None, port: int = ROUTER_PORT) -> tuple[int, str]:
    head = lab.inventory.hosts[0]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    request = json.dumps({"key": key, "url": url, "prompt": PROMPT})  # the prompt of lab.demo.chat
    done = lab.lab.ssh(head.name, ["python3", "-c", CHAT_ON_HEAD], stdin=request, timeout=120)
    assert done.returncode == 0, done.stderr
    status, content = json.loads(done.stdout)
    return int(status), str(content)


def gateway_vars(tmp_path: Path, services: list[dict[str, Any]], **more: str) -> str:
    extra = tmp_path / f"gateway-{len(services)}-{len(more)}.json"
    extra.write_text(json.dumps({"gateway_services": services, **more}), encoding="utf-8")
    return f"@{extra}"


def test_the_gateway_routes_to_vllm_with_the_key_restarts_and_is_removed(
    lab: RunningLab, deployment: Deployment, tmp_path: Path
) -> None:
    """The gateway role on the head, one service whose worker is the deployed vLLM, the router's wheel from
    the bundle: check mode changes nothing; the router answers on loopback with vLLM's answer, refuses no
    key (vLLM's 401: the header is forwarded); the edge (HAProxy, from the bundle) answers this machine with
    the same, 401 without the key and 404 for an unknown model, its key in a 0600 file; a second run, given
    the same wheel off the bundle, changes nothing; `status` shows the router and its healthy worker; kill -9
    of the router is restarted by systemd; the port answers nothing off the head; a run without the service
    removes it and stops the edge."""
    head = lab.inventory.hosts[0]
    unit = "gpufleet-router@tiny.service"
    services = [
        {"name": "tiny", "port": ROUTER_PORT, "metrics_port": 29200, "workers": [f"http://{head.ip}:8000"]}
    ]
    edge_port = str(EDGE_PORT)  # the edge (HAProxy) beside the deployment's own vLLM on 8000
    listed = gateway_vars(
        tmp_path, services, gpufleet_bundle_dir=str(deployment.bundle), gateway_edge_port=edge_port
    )
    lock = yaml.safe_load((deployment.bundle / "bundle.lock.yml").read_text(encoding="utf-8"))
    (wheel,) = [entry for entry in lock["files"] if entry["path"].startswith("gateway/vllm_router-")]
    explicit = gateway_vars(
        tmp_path,
        services,
        gateway_router_wheel=str(deployment.bundle / wheel["path"]),
        gateway_router_sha256=wheel["sha256"],
        gateway_edge_port=edge_port,
    )

    checked = playbook(deployment.inventory, "gateway.yml", "-e", listed, "--check")
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert lab.ssh(head.name, ["test", "-e", "/etc/gpufleet/gateway"]).returncode != 0, (
        "check mode wrote files"
    )

    first = playbook(deployment.inventory, "gateway.yml", "-e", listed)
    assert first.returncode == 0, first.stdout[-4000:]
    direct_status, direct = chat(f"http://{head.ip}:8000/v1", deployment.key, "tiny")
    assert chat_on_head(lab, deployment.key) == (200, direct["choices"][0]["message"]["content"])
    assert direct_status == 200
    assert chat_on_head(lab, None)[0] == 401
    assert deployment.key not in first.stdout
    edge = f"http://{head.ip}:{EDGE_PORT}/v1"  # the edge answers this machine; the key checked at the door
    assert chat(edge, deployment.key, "tiny")[1]["choices"][0]["message"] == direct["choices"][0]["message"]
    assert [chat(edge, key, model)[0] for key, model in ((None, "tiny"), (deployment.key, "nope"))] == [
        401,
        404,
    ]
    assert lab.ssh(head.name, ["stat", "-c", "%a %U", "/etc/haproxy/gpufleet-keys.map"]).stdout.split() == [
        "600",
        "root",
    ]
    seen = status(deployment.inventory)  # the router's own view of its worker, through playbooks/status.yml
    assert [(r.service, r.port, r.active, r.workers, r.healthy) for r in seen.gateway] == [
        ("tiny", ROUTER_PORT, "active", (f"http://{head.ip}:8000",), (f"http://{head.ip}:8000",))
    ], seen.gateway
    assert seen.ok, seen.problems

    second = playbook(deployment.inventory, "gateway.yml", "-e", explicit)
    assert second.returncode == 0 and re.search(r"changed=0\s", second.stdout), second.stdout[-3000:]

    with pytest.raises(OSError):  # the router binds loopback on the head only
        socket.create_connection((head.ip, ROUTER_PORT), timeout=5).close()

    (pid,) = lab.ssh(head.name, ["systemctl", "show", "-P", "MainPID", unit]).stdout.split()
    assert lab.ssh(head.name, ["kill", "-KILL", pid]).returncode == 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and chat_on_head(lab, deployment.key)[0] != 200:
        time.sleep(1)
    assert chat_on_head(lab, deployment.key)[0] == 200, "the router did not answer within 60 s of kill -9"
    (again,) = lab.ssh(head.name, ["systemctl", "show", "-P", "MainPID", unit]).stdout.split()
    assert again not in ("0", pid)

    removed = playbook(deployment.inventory, "gateway.yml", "-e", gateway_vars(tmp_path, []))
    assert removed.returncode == 0, removed.stdout[-3000:]
    assert lab.ssh(head.name, ["systemctl", "is-active", unit]).stdout.strip() != "active"
    with pytest.raises(OSError):  # no service, no edge
        socket.create_connection((head.ip, EDGE_PORT), timeout=5).close()
    assert lab.ssh(head.name, ["test", "-e", "/etc/gpufleet/gateway/tiny.json"]).returncode != 0


# ----- upgrades and rollback (issue 14): a second tag of the lab image, then a broken one, then back
# (services_support.py: IMAGE, UPGRADE, BROKEN)


def kept_revision(lab: RunningLab, host: str, slot: str) -> dict[str, Any] | None:
    return replica_revision(lab, host, "default", slot)


@pytest.fixture(scope="module")
def upgrade_images(lab: RunningLab, deployment: Deployment) -> dict[str, str]:
    ids = make_images(lab.lab, IMAGE)
    assert len(set(ids.values())) == 3, ids
    return ids


def answers(lab: RunningLab, deployment: Deployment) -> str:
    """A chat completion's text from the head's endpoint with the key (asserting HTTP 200)."""
    head = lab.inventory.hosts[0]
    code, body = chat(f"http://{head.ip}:8000/v1", deployment.key, "tiny")
    assert code == 200, body
    return str(body["choices"][0]["message"]["content"])


def test_an_upgrade_to_a_second_tag_changes_only_the_units_and_keeps_the_previous_revision(
    lab: RunningLab, deployment: Deployment, upgrade_images: dict[str, str]
) -> None:
    report = deploy(
        deployment.inventory, stages=["cluster", "serve", "verify"], extra_vars={"ray_cluster_image": UPGRADE}
    )

    assert report.ok, failures(report)
    changed = {stage.name: {host.host: host.changed for host in stage.hosts} for stage in report.stages}
    print(f"upgrade: {report.seconds:.0f} s, changed {changed}; downtime {report.downtime}")
    # cluster: the Ray unit (it runs the image by ID) on every node, its restart (head; then each worker,
    # announced and done); serve: nothing (vLLM restarts with Ray's unit); verify: the new revision recorded.
    assert changed == {
        "cluster": {"node1": 2, "node2": 3, "node3": 3},
        "serve": {"node1": 0, "node2": 0, "node3": 0},
        "verify": {"node1": 1, "node2": 1, "node3": 1},
    }
    downtime = report.downtime
    assert downtime is not None and downtime.answered_before and downtime.answers_after
    assert downtime.outages == 1 and 0 < downtime.seconds < 600, downtime
    for host in lab.hosts:
        current, previous = kept_revision(lab, host, "current"), kept_revision(lab, host, "previous")
        assert current is not None and current["image_id"] == upgrade_images[UPGRADE], (host, current)
        assert previous is not None and previous["image_id"] == upgrade_images[IMAGE], (host, previous)
        assert image_id(lab.lab, host, "gpufleet/revision:previous") == upgrade_images[IMAGE]
    assert answers(lab, deployment)


def test_an_upgrade_to_an_image_that_exits_at_start_is_rolled_back_and_answers_again(
    lab: RunningLab, deployment: Deployment, upgrade_images: dict[str, str]
) -> None:
    report = deploy(
        deployment.inventory, stages=["cluster", "serve", "verify"], extra_vars={"ray_cluster_image": BROKEN}
    )

    print(f"broken: {report.seconds:.0f} s, downtime {report.downtime}, rollback {report.rollback}")
    assert not report.ok and report.failed_stage == "serve", failures(report)
    said = failures(report)
    assert "vLLM exited and its unit restarted 2 times" in said, said  # not the 30 min start timeout
    assert BROKEN_MESSAGE in said, said  # the end of vLLM's log
    back = report.rollback
    assert back is not None and back.ok and back.slot == "current" and back.restarted, back
    assert back.revision is not None and back.revision.image_id == upgrade_images[UPGRADE]
    for host, lines in back.restored.items():
        assert "/etc/systemd/system/gpufleet-ray.service (restored)" in lines, (host, lines)
    head = lab.hosts[0]
    unit = lab.ssh(head, ["systemctl", "cat", "gpufleet-ray.service"]).stdout
    assert upgrade_images[UPGRADE] in unit and upgrade_images[BROKEN] not in unit
    assert answers(lab, deployment)
    downtime = report.downtime
    assert downtime is not None and downtime.answers_after and downtime.seconds > 0, downtime
    current = kept_revision(lab, head, "current")
    assert current is not None and current["image_id"] == upgrade_images[UPGRADE]  # kept, not replaced


def test_gpufleet_rollback_brings_the_previous_revision_back(
    lab: RunningLab,
    deployment: Deployment,
    upgrade_images: dict[str, str],
    installed_gpufleet: Path,
    tmp_path: Path,
) -> None:
    ray_before = ray_started(lab)
    run, report = rollback_from_wheel(installed_gpufleet, deployment.inventory, tmp_path)

    print(f"rollback: {report.seconds:.0f} s, downtime {report.downtime}")
    ray_after = ray_started(lab)
    # the image changed: Ray restarted too, on every node
    assert all(ray_after[host] != ray_before[host] for host in lab.hosts), (ray_before, ray_after)
    assert run.returncode == 0 and report.ok, failures(report)
    back = report.rollback
    assert back is not None and back.slot == "previous" and back.revision is not None
    assert back.revision.image_id == upgrade_images[IMAGE] and back.revision.image_name == IMAGE
    assert report.downtime is not None and report.downtime.answers_after
    head = lab.hosts[0]
    assert upgrade_images[IMAGE] in lab.ssh(head, ["systemctl", "cat", "gpufleet-ray.service"]).stdout
    assert answers(lab, deployment)
    current, previous = kept_revision(lab, head, "current"), kept_revision(lab, head, "previous")
    # rolling back again would return to where it was
    assert current is not None and current["image_id"] == upgrade_images[IMAGE]
    assert previous is not None and previous["image_id"] == upgrade_images[UPGRADE]


# ----- the release before instances (issue 34 step 1): a fleet it served is migrated by this release's deploy
# (migration_support.py: that release's tree from git history, its serve and verify stages on this lab). Here,
# after the upgrades: a rollback to the revision it kept then, and a deploy that migrates again, so that the
# teardown below stops this release's instance.
# heavy (`make test-all`, issue 33): the four tests restart vLLM four times and run the release before's own
# playbooks, 362 s of the end-to-end file (the floor of `make test`) for a path each fleet takes once, on its
# first deploy of this release. What the migration is made of stays in `make test`: the revision module
# records across it (test_revision_module.py), the release before's files are part of every revision
# (test_vllm_service_templates.py), and an upgrade, the broken image and `gpufleet rollback` run above.
MIGRATION = pytest.mark.heavy


@dataclass(frozen=True)
class Migration:
    before: dict[str, Any]  # the revision the release before recorded on the head (its layout, no unit named)
    report: DeployReport  # this release's deploy over it
    again: DeployReport  # and the one after


@pytest.fixture(scope="module")
def migration(
    lab: RunningLab,
    deployment: Deployment,
    installed_gpufleet: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Migration:
    tree = previous_release(REPO, tmp_path_factory.mktemp("previous-release"))
    serve_with(tree, lab, deployment.inventory, deployment.bundle)
    head = lab.hosts[0]
    assert lab.ssh(head, ["systemctl", "is-active", LEGACY_UNIT]).stdout.strip() == "active"
    assert present(lab, head, LEGACY_FILES) == list(LEGACY_FILES)
    read = lab.ssh(head, ["cat", "/var/lib/gpufleet/revisions/current/revision.json"])
    assert read.returncode == 0, read.stderr
    elsewhere = tmp_path_factory.mktemp("migrate")
    report = deploy_from_wheel(installed_gpufleet, deployment.inventory, deployment.bundle, elsewhere)
    again = deploy_from_wheel(installed_gpufleet, deployment.inventory, deployment.bundle, elsewhere)
    print(f"migration: {report.seconds:.0f} s, downtime {report.downtime}; again {again.seconds:.0f} s")
    return Migration(json.loads(read.stdout), report, again)


@MIGRATION
def test_a_deploy_migrates_the_release_before_instances_with_one_restart(
    lab: RunningLab, deployment: Deployment, migration: Migration
) -> None:
    report = migration.report
    assert report.ok, failures(report)
    changed = {stage.name: {h.host: h.changed for h in stage.hosts if h.changed} for stage in report.stages}
    # serve: the instance's files, the old unit stopped, its files, stamp and revisions moved (every node:
    # each keeps revisions); verify: the revision recorded. Every other role changes nothing.
    assert {name for name, hosts in changed.items() if hosts} == {"serve", "verify"}, changed
    assert set(changed["serve"]) == set(lab.hosts), changed
    downtime = report.downtime
    assert downtime is not None and downtime.answered_before and downtime.answers_after, downtime
    assert downtime.outages == 1, downtime  # one restart
    head = lab.hosts[0]
    assert lab.ssh(head, ["systemctl", "is-active", VLLM_UNIT]).stdout.strip() == "active"
    assert lab.ssh(head, ["systemctl", "is-enabled", VLLM_UNIT]).stdout.strip() == "enabled"
    assert present(lab, head, INSTANCE_FILES) == list(INSTANCE_FILES)
    for host in lab.hosts:
        assert present(lab, host, LEGACY_FILES) == [], host
        top = present(
            lab, host, tuple(f"/var/lib/gpufleet/revisions/{slot}" for slot in ("current", "previous"))
        )
        assert top == [], (host, top)
        current, previous = kept_revision(lab, host, "current"), kept_revision(lab, host, "previous")
        assert current is not None and current["unit"] == VLLM_UNIT, (host, current)
        assert previous is not None and "unit" not in previous, (host, previous)  # the one kept before
    kept = kept_revision(lab, head, "previous") or {}
    assert (kept.get("fleet"), kept.get("files")) == (migration.before["fleet"], migration.before["files"])
    assert answers(lab, deployment)


@MIGRATION
def test_the_deploy_after_the_migration_changes_nothing(migration: Migration) -> None:
    again = migration.again
    assert again.ok, failures(again)
    assert {f"{s.name}/{h.host}": h.changed for s in again.stages for h in s.hosts if h.changed} == {}


@MIGRATION
def test_a_rollback_to_the_revision_kept_before_the_migration_puts_that_release_back_whole(
    lab: RunningLab, deployment: Deployment, migration: Migration, installed_gpufleet: Path, tmp_path: Path
) -> None:
    ray_before = ray_started(lab)
    run, report = rollback_from_wheel(installed_gpufleet, deployment.inventory, tmp_path)

    print(f"rollback across the migration: {report.seconds:.0f} s, downtime {report.downtime}")
    assert run.returncode == 0 and report.ok, failures(report)
    assert report.rollback is not None and report.rollback.restarted
    assert ray_started(lab) == ray_before  # vLLM's files alone came back: vLLM restarted, Ray kept running
    head = lab.hosts[0]
    assert lab.ssh(head, ["systemctl", "is-active", LEGACY_UNIT]).stdout.strip() == "active"
    assert lab.ssh(head, ["systemctl", "is-enabled", LEGACY_UNIT]).stdout.strip() == "enabled"
    assert lab.ssh(head, ["systemctl", "is-active", VLLM_UNIT]).stdout.strip() != "active"
    for host in lab.hosts:
        assert present(lab, host, INSTANCE_FILES) == [], host  # not beside the release before: instead of it
    assert present(lab, head, LEGACY_FILES) == list(LEGACY_FILES)
    assert answers(lab, deployment)
    current = kept_revision(lab, head, "current")
    assert current is not None and current["unit"] == LEGACY_UNIT, current  # rolling back again returns


@MIGRATION
def test_the_deploy_after_that_rollback_migrates_again(
    lab: RunningLab, deployment: Deployment, installed_gpufleet: Path, tmp_path: Path
) -> None:
    """...and leaves this release's instance for the teardown below (which stops every instance)."""
    report = deploy_from_wheel(installed_gpufleet, deployment.inventory, deployment.bundle, tmp_path)

    assert report.ok, failures(report)
    head = lab.hosts[0]
    assert lab.ssh(head, ["systemctl", "is-active", VLLM_UNIT]).stdout.strip() == "active"
    assert present(lab, head, LEGACY_FILES) == []
    assert answers(lab, deployment)


def test_status_reports_a_stopped_service_without_failing(
    lab: RunningLab, deployment: Deployment, tmp_path: Path
) -> None:
    """teardown stops the gateway (a router and the edge, started here in front of the deployed vLLM), every
    vLLM instance and the monitoring units; status then reports the stopped service without failing."""
    head_ip = lab.inventory.hosts[0].ip
    worker = {
        "name": "tiny",
        "port": ROUTER_PORT,
        "metrics_port": 29200,
        "workers": [f"http://{head_ip}:8000"],
    }
    gateway = gateway_vars(
        tmp_path, [worker], gpufleet_bundle_dir=str(deployment.bundle), gateway_edge_port=str(EDGE_PORT)
    )
    started = playbook(deployment.inventory, "gateway.yml", "-e", gateway)
    assert started.returncode == 0, started.stdout[-3000:]
    socket.create_connection((head_ip, EDGE_PORT), timeout=5).close()  # the edge answers before teardown

    stopped = teardown(deployment.inventory)
    assert stopped.ok, stopped.model_dump_json()[-6000:]  # the whole report: a loop's items say why
    head = lab.hosts[0]
    assert lab.ssh(head, ["systemctl", "is-enabled", VLLM_UNIT]).stdout.strip() == "disabled"
    gateway_units = ["gpufleet-router@tiny.service", "haproxy.service"]
    assert lab.ssh(head, ["systemctl", "is-enabled", *gateway_units]).stdout.split() == ["disabled"] * 2
    with pytest.raises(OSError):
        socket.create_connection((head_ip, EDGE_PORT), timeout=5).close()
    for host in lab.hosts:  # teardown stops the monitoring units too
        units = ["gpufleet-prometheus", "gpufleet-node-exporter", "gpufleet-grafana"]
        states = lab.ssh(host, ["systemctl", "is-active", *units])
        assert "active" not in states.stdout.split(), (host, states.stdout)

    report = status(deployment.inventory)

    assert report.stage.status == "ok", report.stage
    assert not report.vllm_ready
    assert report.ray_nodes_alive == 0
    assert not report.ok


# ----- after teardown: preflight checks broken on purpose, then an image without Ray (executor auto -> mp)
# The images stay on the hosts after teardown; each case runs the stage's playbook from this checkout against
# the deployed lab and restores what it broke.

NO_RAY = "gpufleet/vllm-cpu:0.32.0-noray"


def playbook(inventory: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / name), *args]
    return run_playbook(argv, timeout=1200)


@pytest.fixture(scope="module")
def image_without_ray(lab: RunningLab, deployment: Deployment) -> str:
    """The lab image less Ray, made on the head (docker commit of a container that deleted Ray): what vLLM's
    images from 0.19.1 on look like to gpufleet."""
    head = lab.hosts[0]
    script = (
        "docker rm -f gpufleet-noray >/dev/null 2>&1; "
        f"docker run --name gpufleet-noray --entrypoint /bin/sh {IMAGE} -c "
        "'rm -rf /opt/vllm/bin/ray /opt/vllm/lib/python3*/site-packages/ray' && "
        f"docker commit gpufleet-noray {NO_RAY} && docker rm gpufleet-noray"
    )
    made = lab.ssh(head, ["sh", "-c", script], timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    return NO_RAY


def test_preflight_refuses_a_worker_whose_image_differs_from_the_heads(
    lab: RunningLab, deployment: Deployment, image_without_ray: str
) -> None:
    worker = lab.hosts[1]
    original = lab.ssh(worker, ["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE]).stdout.strip()
    other = lab.ssh(worker, ["sh", "-c", f"docker image ls -q --no-trunc | grep -v {original} | head -1"])
    assert other.stdout.strip(), "the worker needs a second image to point the tag at"
    lab.ssh(worker, ["docker", "tag", other.stdout.strip(), IMAGE])
    try:
        run = playbook(deployment.inventory, "cluster.yml", "--check")
    finally:
        lab.ssh(worker, ["docker", "tag", original, IMAGE])
    assert run.returncode != 0
    assert f"{worker}: image {IMAGE} is {other.stdout.strip()} here but {original} on the head" in run.stdout


def test_preflight_refuses_a_dev_shm_too_small_for_nccl(deployment: Deployment) -> None:
    run = playbook(deployment.inventory, "cluster.yml", "--check", "-e", "ray_cluster_shm_size=64m")
    assert run.returncode != 0
    assert "the container's /dev/shm would be 0.06 GiB (ray_cluster_shm_size=64m)" in run.stdout, run.stdout[
        -3000:
    ]
    assert "Fix: raise ray_cluster_shm_size" in run.stdout


def test_preflight_names_a_blocked_cluster_port(lab: RunningLab, deployment: Deployment) -> None:
    head = lab.hosts[0]
    rule = ["INPUT", "-p", "tcp", "--dport", "29501", "-j", "DROP"]
    lab.ssh(head, ["iptables", "-I", *rule])
    try:
        run = playbook(deployment.inventory, "preflight.yml", "-e", "preflight_port_probe_timeout=4")
    finally:
        lab.ssh(head, ["iptables", "-D", *rule])
    assert run.returncode != 0
    for worker in lab.hosts[1:]:
        assert f"host {worker} (" in run.stdout and "cannot reach the head node1" in run.stdout
    assert "TCP 29501 (vLLM's mp master port): timed out" in run.stdout, run.stdout[-3000:]
    assert "TCP 6379" not in run.stdout  # the open port is not blamed
    assert playbook(deployment.inventory, "preflight.yml").returncode == 0


def test_preflight_refuses_a_model_that_does_not_fit_where_it_goes(
    lab: RunningLab, deployment: Deployment
) -> None:
    """Sized from the bundle's lock: a 1 MiB tmpfs as the model directory of every node is refused per node,
    naming the file system, the free and needed GiB and the fix; the images (already loaded) need nothing."""
    for host in lab.hosts:
        lab.ssh(host, ["sh", "-c", "mkdir -p /mnt/small && mount -t tmpfs -o size=1m tmpfs /mnt/small"])
    try:
        run = playbook(
            deployment.inventory,
            "preflight.yml",
            *("-e", f"gpufleet_bundle_dir={deployment.bundle}", "-e", "gpufleet_model_dir=/mnt/small/tiny"),
        )
    finally:
        for host in lab.hosts:
            lab.ssh(host, ["umount", "/mnt/small"])
    assert run.returncode != 0
    assert (
        "host node1: the file system of /mnt/small has 0.0 GiB free, the bundle still brings" in run.stdout
    ), run.stdout[-3000:]
    # node1's message (not the task names, which say "bundle still brings" and "images" too): the model only
    message = run.stdout.split("has 0.0 GiB free, the bundle still brings")[1].split("Fix:")[0]
    assert "model gpufleet/tiny-qwen2" in message and "image" not in message, message


def test_an_image_without_ray_serves_with_the_mp_executor_and_ray_is_refused(
    lab: RunningLab, deployment: Deployment, image_without_ray: str, tmp_path: Path
) -> None:
    """One node (the head) with the image without Ray: `ray` is refused at the cluster stage's preflight
    naming the fix; auto (the default) starts an idle container and vLLM's mp executor, which serves."""
    single = tmp_path / "single"
    single.mkdir()
    head = lab.inventory.hosts[0]
    hosts = yaml.safe_load(deployment.inventory.read_text(encoding="utf-8"))
    groups = hosts["all"]["children"]["gpu_nodes"]["children"]
    groups["ray_workers"] = {"hosts": {}}
    (single / "hosts.yml").write_text(yaml.safe_dump(hosts), encoding="utf-8")
    (single / "group_vars").symlink_to((deployment.inventory.parent / "group_vars").resolve())
    shutil.copy(api_key_file(deployment.inventory), single / "gpufleet.apikey")
    inventory = single / "hosts.yml"

    refused = playbook(
        inventory, "cluster.yml", "-e", f"ray_cluster_image={NO_RAY}", "-e", "vllm_service_executor=ray"
    )
    assert refused.returncode != 0
    assert f"image {NO_RAY}" in refused.stdout and "has no `ray` command" in refused.stdout, refused.stdout[
        -3000:
    ]
    assert "Fix: set vllm_service_executor to auto or mp" in refused.stdout

    for stage in ("cluster.yml", "serve.yml"):
        run = playbook(inventory, stage, "-e", f"ray_cluster_image={NO_RAY}")
        assert run.returncode == 0, run.stdout[-4000:]
    unit = lab.ssh(head.name, ["systemctl", "show", "--property=Description", "--value", VLLM_UNIT])
    assert "mp executor, rank 0" in unit.stdout, unit.stdout
    container = lab.ssh(head.name, ["systemctl", "cat", "gpufleet-ray.service"]).stdout
    assert "--entrypoint=sleep" in container, container
    code, body = chat(f"http://{head.ip}:8000/v1", deployment.key, "tiny")
    assert code == 200 and body["choices"][0]["message"]["content"], body
    assert chat(f"http://{head.ip}:8000/v1", None, "tiny")[0] == 401
