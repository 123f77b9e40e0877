"""The air-gapped end-to-end deployment: every stage, for real, from the lab bundle onto the session lab.

The session lab is offline (hosts reach each other and this machine's bridge address only). The module
gives its three hosts fresh root file systems, and each a default route to the bridge, where the lab's DROP
rules drop and count anything meant for beyond the lab. Then ``deploy()`` runs preflight, nodes, artifacts,
cluster, serve and verify from the bundle (Docker 20.10 from Debian's packages, the CPU serving image, the
tiny model), and a second ``deploy()`` must change nothing. Both deploys are ``gpufleet deploy --json`` of
the wheel built from this checkout and installed into a fresh venv outside it, run from a directory
outside it: they prove the wheel (its collection, its plugins, its ansible.cfg), not the checkout. At the
end the hosts are reset again, so that later tests find them fresh.

The bundle is ``dist/lab-bundle`` (built by :func:`gpufleet.lab.demo.build_lab_bundle`, cached like ``make
demo``'s; the serving image comes from ``~/.cache/gpufleet/serving-image``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import RunningLab, run_installed
from rich.console import Console

from gpufleet.lab.demo import DIST, api_key_file, build_lab_bundle, chat, lab_plan, route_to_bridge
from gpufleet.lab.net import outbound_drops
from gpufleet.runner import STAGES, DeployReport, status, teardown
from gpufleet.vllm_log import compare

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]


@dataclass(frozen=True)
class Deployment:
    inventory: Path
    bundle: Path
    first: DeployReport
    second: DeployReport
    outbound_packets: int

    @property
    def key(self) -> str:
        return api_key_file(self.inventory).read_text(encoding="utf-8").strip()


@pytest.fixture(scope="module")
def lab_bundle() -> Path:
    return build_lab_bundle(DIST / "lab-bundle", DIST / "lab-demo", Console(stderr=True))


def deploy_from_wheel(installed: Path, inventory: Path, bundle: Path, cwd: Path) -> DeployReport:
    """`gpufleet deploy --json` of the installed wheel; its report, parsed."""
    run = run_installed(
        installed, "deploy", "-i", str(inventory), "--bundle", str(bundle), "--json", cwd=cwd, timeout=3000
    )
    assert run.stdout.strip(), (
        f"gpufleet deploy printed no report (exit {run.returncode}): {run.stderr[-3000:]}"
    )
    return DeployReport.model_validate_json(run.stdout)


@pytest.fixture(scope="module")
def deployment(
    lab: RunningLab, lab_bundle: Path, installed_gpufleet: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    inventory = lab.lab.reset().inventory
    route_to_bridge(lab.lab, lab.inventory)
    before = outbound_drops(lab.inventory.name)
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # not the checkout: nothing found relative to it
    try:
        first = deploy_from_wheel(installed_gpufleet, inventory, lab_bundle, elsewhere)
        second = (
            deploy_from_wheel(installed_gpufleet, inventory, lab_bundle, elsewhere) if first.ok else first
        )
        dropped = outbound_drops(lab.inventory.name) - before
        print(f"e2e: first deploy {first.seconds:.0f} s, second {second.seconds:.0f} s; dropped {dropped}")
        yield Deployment(inventory, lab_bundle, first, second, dropped)
    finally:
        lab.lab.reset()


def failures(report: DeployReport) -> str:
    return "; ".join(
        [f"{f.stage}/{f.host}/{f.task}: {f.message}" for f in report.failures]
        + [f"{s.name}: {s.error}" for s in report.stages if s.error]
    )


def test_the_first_deploy_runs_every_stage(deployment: Deployment) -> None:
    report = deployment.first
    assert report.ok, failures(report)
    assert [stage.name for stage in report.stages] == list(STAGES)
    # verify runs on the head; serve on every node (the workers' tasks skip with the Ray executor)
    assert {stage.name: len(stage.hosts) for stage in report.stages} == {
        name: 1 if name == "verify" else 3 for name in STAGES
    }
    assert report.changed > 0


def test_the_second_deploy_changes_nothing(deployment: Deployment) -> None:
    report = deployment.second
    assert report.ok, failures(report)
    changed = {f"{s.name}/{h.host}": h.changed for s in report.stages for h in s.hosts if h.changed}
    assert changed == {}


def test_no_host_sent_anything_beyond_the_lab(deployment: Deployment) -> None:
    assert deployment.outbound_packets == 0


def test_ray_sees_three_nodes_and_vllm_is_ready(deployment: Deployment) -> None:
    report = status(deployment.inventory)

    assert report.stage.status == "ok", report.stage
    assert (report.ray_nodes_alive, report.ray_nodes_expected) == (3, 3)
    assert report.vllm_ready
    assert report.ok
    assert report.endpoint == deployment.first.endpoint


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


def test_status_reports_a_stopped_service_without_failing(deployment: Deployment) -> None:
    stopped = teardown(deployment.inventory)
    assert stopped.ok, failures(stopped)

    report = status(deployment.inventory)

    assert report.stage.status == "ok", report.stage
    assert not report.vllm_ready
    assert report.ray_nodes_alive == 0
    assert not report.ok
