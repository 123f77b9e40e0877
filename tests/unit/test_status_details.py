"""`gpufleet status` names what is wrong (issue 13 items 2 and 8): the Ray nodes that are missing, a node
whose container is down, vLLM processes outside the service and GPU memory held outside it, and start-up
figures that are stale because vLLM is down. The playbook's facts are fed to status() as
playbooks/status.yml publishes them (tests/integration/test_supervision.py runs the playbook itself)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpufleet.runner import api
from gpufleet.runner.progress import print_status_report
from gpufleet.runner.report import HostResult, StageResult, StatusReport

HOSTS = ("node1", "node2", "node3")
NO_GPU = "no nvidia-smi on this host (no GPU driver)"
FACTS = {"weights_gib": 0.01, "ready_seconds": 41.5, "served_model_name": "tiny"}


def node(container: str = "running", orphans: tuple[dict[str, Any], ...] = (), **gpu: Any) -> dict[str, Any]:
    return {
        "container": container,
        "container_unit": "active" if container == "running" else "activating",
        "vllm_unit": "active",
        "procs": {
            "orphans": list(orphans),
            "gpu": gpu or {"checked": False, "why": NO_GPU, "outside": []},
        },
    }


def healthy_facts() -> dict[str, Any]:
    return {
        "gpufleet_vllm_ready": True,
        "gpufleet_ray_nodes_alive": 3,
        "gpufleet_ray_nodes_expected": 3,
        "gpufleet_ray_nodes_missing": [],
        "gpufleet_nodes": {host: node() for host in HOSTS},
        "gpufleet_vllm_facts": FACTS,
        "gpufleet_endpoint": "http://10.0.0.1:8000/v1",
    }


def run_status(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, facts: dict[str, Any]) -> StatusReport:
    stage = StageResult(name="status", status="ok", seconds=1.0, hosts=(HostResult(host="node1"),))

    def fake_run(*_: Any) -> tuple[list[StageResult], dict[str, tuple[str, Any]]]:
        return [stage], {name: ("node1", value) for name, value in facts.items()}

    monkeypatch.setattr(api, "run_stages", fake_run)
    (tmp_path / "hosts.yml").write_text("all: {}\n", encoding="utf-8")
    report = api.status(tmp_path / "hosts.yml")
    assert isinstance(report, StatusReport)
    return report


def shown(report: StatusReport) -> str:
    console = Console(width=200, record=True, color_system=None)
    print_status_report(console, report)
    return console.export_text()


def test_a_whole_fleet_is_healthy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = run_status(monkeypatch, tmp_path, healthy_facts())

    assert report.ok and report.problems == []
    text = shown(report)
    assert "healthy" in text and "not healthy" not in text and "stale" not in text
    assert "GPU memory check skipped: no nvidia-smi" in text


def test_the_missing_ray_node_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    facts = healthy_facts() | {
        "gpufleet_ray_nodes_alive": 2,
        "gpufleet_ray_nodes_missing": [
            {
                "host": "node3",
                "ip": "10.0.0.3",
                "gpus": 0,
                "why": "not registered with Ray under its gpufleet_node_ip",
            }
        ],
    }
    report = run_status(monkeypatch, tmp_path, facts)

    assert not report.ok
    assert [m.host for m in report.ray_nodes_missing] == ["node3"]
    text = shown(report)
    assert "Ray nodes alive: 2 of 3; missing: node3" in text
    assert "Ray does not report node3: not registered with Ray" in text


def test_a_down_worker_container_is_not_healthy_even_while_ray_still_counts_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    facts = healthy_facts()  # Ray has not noticed yet: 3 of 3 alive
    facts["gpufleet_nodes"]["node2"] = node("exited")
    report = run_status(monkeypatch, tmp_path, facts)

    assert not report.ok
    text = shown(report)
    assert "node2: the Ray container is exited" in text
    assert "not healthy" in text


def test_an_unreachable_node_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    facts = healthy_facts()
    facts["gpufleet_nodes"]["node3"] = {"container": "unreachable"}
    report = run_status(monkeypatch, tmp_path, facts)

    assert not report.ok
    assert "node3: unreachable" in shown(report)


def test_figures_are_marked_stale_while_vllm_is_down(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = run_status(monkeypatch, tmp_path, healthy_facts() | {"gpufleet_vllm_ready": False})

    assert report.vllm_facts_stale and not report.ok
    text = shown(report)
    assert "vLLM start to ready: 41.5 s (stale: last run; vLLM is down)" in text


def test_fresh_figures_are_not_marked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = run_status(monkeypatch, tmp_path, healthy_facts())

    assert not report.vllm_facts_stale
    assert "vLLM start to ready: 41.5 s\n" in shown(report)


def test_orphans_are_reported_with_pid_and_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    facts = healthy_facts()
    orphan = {"pid": 4242, "container_pid": 57, "cmd": "VLLM::EngineCore", "rss_mib": 2210, "marked": True}
    facts["gpufleet_nodes"]["node1"] = node(orphans=(orphan,))
    report = run_status(monkeypatch, tmp_path, facts)

    assert not report.ok
    said = "node1: 1 vLLM process(es) outside the service: pid 4242 'VLLM::EngineCore' (2210 MiB)"
    assert said in shown(report)


def test_gpu_memory_outside_the_service_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    facts = healthy_facts()
    holder = {"pid": 777, "mib": 30000, "cmd": "python3 train.py", "in_container": False}
    facts["gpufleet_nodes"]["node1"] = node(checked=True, why="", outside=[holder])
    report = run_status(monkeypatch, tmp_path, facts)

    assert not report.ok
    said = "node1: GPU memory held by processes outside the service: pid 777 'python3 train.py' 30000 MiB"
    assert said in shown(report)


def test_an_unreadable_node_report_is_a_problem_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    facts = healthy_facts()
    facts["gpufleet_nodes"]["node1"] = {"container": "running", "procs": {"orphans": [{"pid": "x"}]}}
    report = run_status(monkeypatch, tmp_path, facts)

    assert not report.ok
    assert "node1: vLLM's processes could not be listed: unreadable report" in shown(report)


def test_the_json_report_carries_the_details_and_reads_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`gpufleet status --json` prints StatusReport.model_dump_json: the details are its own fields."""
    facts = healthy_facts() | {
        "gpufleet_vllm_ready": False,
        "gpufleet_ray_nodes_missing": [{"host": "node3", "why": "gone"}],
    }
    report = run_status(monkeypatch, tmp_path, facts)
    printed = json.loads(report.model_dump_json(indent=2))

    assert printed["ray_nodes_missing"] == [{"host": "node3", "why": "gone"}]
    assert [node["host"] for node in printed["nodes"]] == list(HOSTS)
    assert printed["vllm_facts_stale"] is True
    assert StatusReport.model_validate_json(report.model_dump_json()) == report


def test_a_report_without_the_details_still_reads() -> None:
    """A report as gpufleet printed it before the details existed (and a consumer's minimal one)."""
    older = {"ok": True, "vllm_ready": True, "stage": {"name": "status", "status": "ok", "seconds": 1.0}}
    report = StatusReport.model_validate(older)

    assert (report.ray_nodes_missing, report.nodes, report.vllm_facts_stale) == ((), (), False)
    assert report.problems == []


# ----- the gateway's routers (issue 35, operations): the router's own view of each worker -----------------

WORKERS = ["http://10.0.0.1:8101", "http://10.0.0.2:8101"]


def router(**changes: Any) -> dict[str, Any]:
    """A router as the gateway role's facts.yml publishes it."""
    return {"service": "qwen", "port": 30080, "active": "active", "workers": WORKERS, "healthy": WORKERS,
            "answered": True} | changes  # fmt: skip


def test_the_gateways_routers_are_shown_with_their_view_of_each_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = run_status(monkeypatch, tmp_path, healthy_facts() | {"gpufleet_gateway": [router()]})

    assert report.ok and report.problems == []
    assert [(r.service, r.healthy) for r in report.gateway] == [("qwen", tuple(WORKERS))]
    assert "gateway qwen (port 30080): router active, 2 of 2 workers healthy" in shown(report)


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"healthy": WORKERS[:1]}, f"gateway qwen: degraded, the router finds unhealthy: {WORKERS[1]}"),
        ({"healthy": []}, f"gateway qwen: down, the router finds unhealthy: {', '.join(WORKERS)}"),
        (
            {"active": "failed", "answered": False},
            "gateway qwen: its router is not running (systemd: failed)",
        ),
        ({"answered": False}, "gateway qwen: its router's metrics did not answer"),
    ],
)
def test_a_router_down_or_a_worker_it_took_out_makes_status_not_healthy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, changes: dict[str, Any], line: str
) -> None:
    report = run_status(monkeypatch, tmp_path, healthy_facts() | {"gpufleet_gateway": [router(**changes)]})

    assert not report.ok
    assert report.problems == [line]
    assert line in shown(report) and "not healthy" in shown(report)


def test_a_fleet_without_a_gateway_or_with_a_malformed_entry_reads_as_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert run_status(monkeypatch, tmp_path, healthy_facts()).gateway == ()
    odd = healthy_facts() | {"gpufleet_gateway": [{"port": "x"}, "text", router()]}
    assert [r.service for r in run_status(monkeypatch, tmp_path, odd).gateway] == ["qwen"]


# ----- services: every replica, and each service up, degraded or down

REPLICAS = (("tiny-0", "node1"), ("tiny-1", "node2"), ("tiny-2", "node3"), ("tiny-chat-0", "node1"))


def services_facts(down: tuple[str, ...] = (), unit: str = "failed") -> dict[str, Any]:
    """What status.yml publishes for a services fleet: each replica's state, ready = every replica ready."""
    states = [
        {"id": rid, "service": rid.rsplit("-", 1)[0], "node": host, "url": f"http://10.0.0.{i + 1}:8100",
         "gpus": [], "unit": unit if rid in down else "active", "ready": rid not in down}
        for i, (rid, host) in enumerate(REPLICAS)
    ]  # fmt: skip
    # no Ray and no container of the node's own (playbooks/cluster.yml): each replica runs in its own
    nodes = {host: node() | {"container": "none", "container_unit": "none"} for host in HOSTS}
    return healthy_facts() | {
        "gpufleet_replica_states": states,
        "gpufleet_vllm_ready": not down,
        "gpufleet_ray_nodes_alive": None,
        "gpufleet_ray_nodes_expected": None,
        "gpufleet_nodes": nodes,
    }


def test_a_services_fleet_lists_every_replica_and_each_service_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = run_status(monkeypatch, tmp_path, services_facts())

    assert report.ok and report.problems == []
    assert [(r.id, r.node, r.ready) for r in report.replicas] == [(rid, host, True) for rid, host in REPLICAS]
    assert report.services == {"tiny": "up", "tiny-chat": "up"}
    assert report.endpoint is None and report.vllm is None  # no one endpoint: the replicas are listed
    text = shown(report)
    assert "service tiny: up" in text and "  tiny-1 on node2 (GPUs -) http://10.0.0.2:8100: ready" in text
    assert report.ray_nodes_alive is None and "Ray" not in text  # a services fleet runs no Ray


@pytest.mark.parametrize(
    ("down", "services", "lines"),
    [
        (
            ("tiny-1",),
            {"tiny": "degraded", "tiny-chat": "up"},
            ["replica tiny-1 on node2: not ready (its unit failed, http://10.0.0.2:8100)",
             "service tiny: degraded, 2 of 3 replicas ready"],
        ),
        (
            ("tiny-chat-0",),
            {"tiny": "up", "tiny-chat": "down"},
            ["replica tiny-chat-0 on node1: not ready (its unit failed, http://10.0.0.4:8100)",
             "service tiny-chat: down, 0 of 1 replicas ready"],
        ),
    ],
)  # fmt: skip
def test_a_replica_not_ready_names_it_and_its_service_degraded_or_down(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    down: tuple[str, ...],
    services: dict[str, str],
    lines: list[str],
) -> None:
    report = run_status(monkeypatch, tmp_path, services_facts(down))

    assert not report.ok
    assert report.services == services
    assert report.problems == lines
    assert all(line in shown(report) for line in lines)
    assert StatusReport.model_validate_json(report.model_dump_json()) == report


@pytest.mark.parametrize(
    ("down", "state"),
    [
        ((), "up"),
        (("tiny-pd-d0",), "degraded"),
        (("tiny-pd-p0",), "down"),
        (("tiny-pd-d0", "tiny-pd-d1"), "down"),
    ],
)
def test_a_pd_service_is_down_when_every_replica_of_one_role_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, down: tuple[str, ...], state: str
) -> None:
    """A request through a P/D router needs a prefill and a decode replica: one role without a ready replica
    is the service down, though the other role's replicas are ready."""
    facts = services_facts()
    facts["gpufleet_replica_states"] = [
        {"id": rid, "service": "tiny-pd", "node": host, "url": f"http://10.0.0.{i + 1}:8101", "gpus": [],
         "role": role, "unit": "failed" if rid in down else "active", "ready": rid not in down}
        for i, (rid, host, role) in enumerate([
            ("tiny-pd-p0", "node1", "prefill"),
            ("tiny-pd-d0", "node2", "decode"),
            ("tiny-pd-d1", "node3", "decode"),
        ])
    ]  # fmt: skip
    report = run_status(monkeypatch, tmp_path, facts)
    assert report.services == {"tiny-pd": state}
    assert [r.role for r in report.replicas] == ["prefill", "decode", "decode"]
    assert "  tiny-pd-d1 on node3 (decode, GPUs -) http://10.0.0.3:8101: " in shown(report)


def test_a_malformed_replica_entry_is_left_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    facts = services_facts()
    facts["gpufleet_replica_states"] = [{"id": "x"}, "text", *facts["gpufleet_replica_states"][:1]]
    assert [r.id for r in run_status(monkeypatch, tmp_path, facts).replicas] == ["tiny-0"]


EDGE = "http://10.0.0.1:8000/v1"


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (401, f"gateway edge {EDGE}: answered HTTP 401 to GET /v1/models with the key"),
        (-1, f"gateway edge {EDGE}: did not answer to GET /v1/models with the key"),
    ],
)
def test_the_edge_is_shown_and_an_edge_that_does_not_answer_makes_status_not_healthy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, status: int, line: str
) -> None:
    """status asks the edge as a client does: every replica ready is not healthy while the one endpoint
    clients use refuses the key or does not answer (HAProxy stopped, its key map stale)."""
    edge = {"url": EDGE, "status": 200, "models": ["tiny", "tiny-chat"]}
    up = run_status(monkeypatch, tmp_path, services_facts() | {"gpufleet_gateway_edge": edge})
    assert up.ok and up.edge is not None and up.edge.models == ("tiny", "tiny-chat")
    assert f"gateway edge {EDGE}: HTTP 200, lists tiny, tiny-chat" in shown(up)

    broken = services_facts() | {"gpufleet_gateway_edge": edge | {"status": status, "models": []}}
    report = run_status(monkeypatch, tmp_path, broken)
    assert not report.ok and report.problems == [line]
    assert line in shown(report)
    assert StatusReport.model_validate_json(report.model_dump_json()) == report


def test_no_edge_published_or_one_model_means_no_edge_in_the_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert run_status(monkeypatch, tmp_path, services_facts() | {"gpufleet_gateway_edge": {}}).edge is None
    one_model = healthy_facts() | {"gpufleet_gateway_edge": {"url": EDGE, "status": 0}}
    assert run_status(monkeypatch, tmp_path, one_model).edge is None  # only services have an edge
