"""A P/D service (issue 39) on the worker's session lab: one model of the fleet as a prefill replica (node1)
and two decode replicas (node2, node3), behind the gateway like any service, through vllm-router's P/D mode.

KV transfer is OFF here (``pd.kv_transfer: false``, the schema's TEST ONLY switch): the lab's image is vLLM's
CPU build, without NIXL, so each decode replica computes the prompt again. What this proves on real hosts:
the placement per role, each replica's unit and settings, the router's P/D configuration (its key a
credential, its port closed to local users other than root and HAProxy), every request sent to the prefill
replica and then to a decode one (the router's own counters and each replica's vLLM), the key enforced at
the edge, status by role, a second deploy that changes nothing, a rolling change of the decode pool under
load that fails no request, and teardown. What it cannot prove: that KV blocks move (NIXL over UCX):
tests/gpu/README.md, "P/D through vllm-router".
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import RunningLab
from services_support import EDGE_PORT, ROUTER_PORT, failures, main_pid, router_workers, served_on_head

from gpufleet.lab.demo import chat, route_to_bridge
from gpufleet.lab.inventory import LAB_SERVING, TINY, services_inventory
from gpufleet.runner import DeployReport, deploy, status, teardown

# heavy (`make test-all`): three more vLLM starts and a rolling change on 2 cores cost `make test` minutes it
# has no room for (issue 33: 25 minutes); the P/D path's placement, rendering, router configuration, lock,
# admit and status are unit-tested (tests/unit/test_pd_services.py, test_gateway_pd.py,
# test_status_details.py).
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(2400)]

SERVICE = "tiny-pd"
PD_SERVICE = {
    "name": SERVICE,
    "model": TINY,
    "serving": LAB_SERVING,
    "pd": {"kv_transfer": False, "prefill": {"replicas": 1}, "decode": {"replicas": 2}},
}
MORE = {"gateway_edge_port": EDGE_PORT, "vllm_service_restart_sec": 3}
CONFIG = f"/etc/gpufleet/gateway/{SERVICE}.json"
DROP_IN = f"/etc/systemd/system/gpufleet-router@{SERVICE}.service.d/pd.conf"
ROUTER_METRICS = r"""
import json, re, sys, urllib.request
port = json.load(open(sys.argv[1]))["service"]["metrics_port"]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
found = {}
pattern = r'^vllm_router_pd_(prefill|decode)_requests_total\{worker="([^"]+)"\} (\S+)$'
for kind, worker, value in re.findall(pattern, text, re.M):
    found[f"{kind} {worker}"] = int(float(value))
print(json.dumps(found))
"""


@dataclass(frozen=True)
class Pd:
    base: Path  # the session lab's inventory: services_inventory() starts from it
    inventory: Path
    bundle: Path
    first: DeployReport
    key_file: Path
    folder: Path

    @property
    def key(self) -> str:
        return self.key_file.read_text(encoding="utf-8").strip()


@pytest.fixture(scope="module")
def pd(lab: RunningLab, lab_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pd]:
    """The session lab reset, then a whole deploy of the P/D service from the bundle; reset again after."""
    base = lab.lab.reset().inventory
    route_to_bridge(lab.lab, lab.inventory)
    folder = tmp_path_factory.mktemp("pd")
    key = folder / "gpufleet.apikey"
    inventory = services_inventory(base, folder / "inventory", [PD_SERVICE], key, MORE)
    try:
        first = deploy(inventory, bundle=lab_bundle, load=0)
        yield Pd(base, inventory, lab_bundle, first, key, folder)
    finally:
        lab.lab.reset(wait=False)


def placed(lab: RunningLab) -> dict[str, tuple[str, str]]:
    """Each replica: its node and its URL (the placement: node1 prefill, then decode spread)."""
    node1, node2, node3 = lab.inventory.hosts
    return {
        f"{SERVICE}-p0": (node1.name, f"http://{node1.ip}:8100"),
        f"{SERVICE}-d0": (node2.name, f"http://{node2.ip}:8100"),
        f"{SERVICE}-d1": (node3.name, f"http://{node3.ip}:8100"),
    }


def on_head(lab: RunningLab, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    head = lab.inventory.hosts[0].name
    done: subprocess.CompletedProcess[str] = lab.lab.ssh(head, list(argv), stdin=stdin, timeout=120)
    return done


def router_counts(lab: RunningLab) -> dict[str, int]:
    done = on_head(lab, "python3", "-c", ROUTER_METRICS, CONFIG)
    assert done.returncode == 0, done.stderr
    counts: dict[str, int] = json.loads(done.stdout)
    return counts


def router_args(lab: RunningLab) -> list[str]:
    done = on_head(lab, "cat", CONFIG)
    assert done.returncode == 0, done.stderr
    args: list[str] = json.loads(done.stdout)["args"]
    return args


def test_the_first_deploy_places_a_prefill_and_two_decode_replicas_behind_a_pd_router(
    lab: RunningLab, pd: Pd
) -> None:
    assert pd.first.ok, failures(pd.first)
    urls = {replica: url for replica, (_, url) in placed(lab).items()}
    assert {r.id: (r.node, r.url) for r in pd.first.replicas} == placed(lab)
    args = router_args(lab)
    assert "--vllm-pd-disaggregation" in args and "--worker-urls" not in args
    pairs = list(itertools.pairwise(args))
    assert [value for flag, value in pairs if flag == "--prefill"] == [urls[f"{SERVICE}-p0"]]
    assert [value for flag, value in pairs if flag == "--decode"] == [
        urls[f"{SERVICE}-d0"],
        urls[f"{SERVICE}-d1"],
    ]
    # each role's files: KV transfer off (the lab's image has no NIXL), the service's settings on both
    for replica, (host, _) in placed(lab).items():
        config = lab.ssh(host, ["cat", f"/etc/gpufleet/instances/{replica}/vllm.yaml"]).stdout
        assert "kv-transfer-config" not in config and "block-size: 32" in config, (replica, config)
    # the router's key is a credential (never in its unit, its configuration or its environment)
    drop_in = on_head(lab, "cat", DROP_IN).stdout
    assert "LoadCredential=key:" in drop_in and pd.key not in drop_in
    assert pd.key not in on_head(lab, "cat", CONFIG).stdout
    shown = on_head(
        lab, "systemctl", "show", f"gpufleet-router@{SERVICE}.service", "-p", "Environment"
    ).stdout
    assert pd.key not in shown
    journal = on_head(lab, "journalctl", "-u", f"gpufleet-router@{SERVICE}.service", "--no-pager").stdout
    assert journal and pd.key not in journal


def test_each_request_through_the_edge_goes_to_the_prefill_replica_then_to_a_decode_one(
    lab: RunningLab, pd: Pd
) -> None:
    edge = f"http://{lab.inventory.hosts[0].ip}:{EDGE_PORT}/v1"
    urls = {replica: url for replica, (_, url) in placed(lab).items()}
    before, served = router_counts(lab), served_on_head(lab, urls)
    assert [chat(edge, pd.key, SERVICE, "Hi")[0] for _ in range(6)] == [200] * 6
    streamed = subprocess.run(
        [
            "curl", "-sN", "-H", f"Authorization: Bearer {pd.key}", "-H", "Content-Type: application/json",
            "-d", json.dumps({"model": SERVICE, "messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 4, "stream": True}),
            f"{edge}/chat/completions",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert streamed.returncode == 0 and streamed.stdout.rstrip().endswith("data: [DONE]"), streamed.stdout[
        -500:
    ]
    after = router_counts(lab)
    counted = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    assert counted[f"prefill {urls[f'{SERVICE}-p0']}"] == 7, counted
    decoded = [counted.get(f"decode {urls[f'{SERVICE}-d{i}']}", 0) for i in range(2)]
    assert sum(decoded) == 7 and min(decoded) >= 3, counted  # round robin over the decode pool
    finished = {name: n - served[name] for name, n in served_on_head(lab, urls).items()}
    assert finished[f"{SERVICE}-p0"] == 7 and finished[f"{SERVICE}-d0"] + finished[f"{SERVICE}-d1"] == 7


def test_the_key_is_enforced_at_the_edge_and_the_router_answers_only_root_and_haproxy(
    lab: RunningLab, pd: Pd
) -> None:
    edge = f"http://{lab.inventory.hosts[0].ip}:{EDGE_PORT}/v1"
    assert chat(edge, None, SERVICE, "Hi")[0] == 401 and chat(edge, "wrong", SERVICE, "Hi")[0] == 401
    # the P/D router puts the key on both legs itself, so it must not be reachable by any other local user
    health = f"http://127.0.0.1:{ROUTER_PORT}/health"
    assert on_head(lab, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", health).stdout == "200"
    refused = on_head(lab, "runuser", "-u", "nobody", "--", "curl", "-s", "-m", "10", health)
    assert refused.returncode == 7, (refused.returncode, refused.stdout)  # curl: failed to connect


def test_status_lists_each_replica_with_its_role_and_the_service_up(lab: RunningLab, pd: Pd) -> None:
    report = status(pd.inventory)
    assert report.ok and report.services == {SERVICE: "up"}, report.problems
    assert sorted((r.id, r.role, r.ready) for r in report.replicas) == [
        (f"{SERVICE}-d0", "decode", True),
        (f"{SERVICE}-d1", "decode", True),
        (f"{SERVICE}-p0", "prefill", True),
    ]
    (router,) = report.gateway
    assert router.active == "active" and sorted(router.healthy) == sorted(router.workers), router


def test_a_second_deploy_changes_nothing(pd: Pd) -> None:
    again = deploy(pd.inventory, bundle=pd.bundle, load=0)
    assert again.ok and again.changed == 0, failures(again)
    assert [s.name for s in again.stages if s.in_sync] == ["nodes", "artifacts", "cluster", "serve"]


def test_a_rolling_change_of_the_decode_pool_under_load_fails_no_request(lab: RunningLab, pd: Pd) -> None:
    """The decode replicas' own setting changes: each is drained from the router, restarted, gated and put
    back by restarting the router (vllm-router's P/D mode has no /add_worker), one node at a time, under a
    steady load through the edge; the prefill replica does not restart."""
    service = {
        **PD_SERVICE,
        "pd": {**PD_SERVICE["pd"], "decode": {"replicas": 2, "serving": {"max_num_seqs": 8}}},
    }
    changed = services_inventory(pd.base, pd.folder / "changed", [service], pd.key_file, MORE)
    where = placed(lab)
    pids = {replica: main_pid(lab, host, replica) for replica, (host, _) in where.items()}
    rolled = deploy(changed, bundle=pd.bundle, stages=["serve", "verify"], load=1, load_interval=2.0)
    assert rolled.ok, failures(rolled)
    loaded = rolled.availability
    assert loaded is not None and loaded.answered_before and loaded.failed == 0, loaded
    now = {replica: main_pid(lab, host, replica) for replica, (host, _) in where.items()}
    assert now[f"{SERVICE}-p0"] == pids[f"{SERVICE}-p0"], (pids, now)
    assert all(now[f"{SERVICE}-d{i}"] != pids[f"{SERVICE}-d{i}"] for i in range(2)), (pids, now)
    for replica, (host, _) in where.items():
        config = lab.ssh(host, ["cat", f"/etc/gpufleet/instances/{replica}/vllm.yaml"]).stdout
        assert ("max-num-seqs: 8" in config) == ("-d" in replica), (replica, config)
    # each decode replica was put back: the router, restarted after each gate, holds all three again
    assert router_workers(lab, ROUTER_PORT) == sorted(url for _, url in where.values())


def test_teardown_stops_the_replicas_the_router_and_its_port_lock(lab: RunningLab, pd: Pd) -> None:
    assert re.search(r"GPUFLEET-PD", on_head(lab, "iptables", "-S").stdout)  # the router's lock, before
    down = teardown(pd.inventory)
    assert down.ok, failures(down)
    for replica, (host, _) in placed(lab).items():
        unit = f"gpufleet-vllm@{replica}.service"
        assert lab.ssh(host, ["systemctl", "is-active", unit]).stdout.strip() != "active", unit
    router = f"gpufleet-router@{SERVICE}.service"
    assert on_head(lab, "systemctl", "is-active", router).stdout.strip() != "active"
    chains = on_head(lab, "iptables", "-S").stdout
    assert not re.search(r"GPUFLEET-PD", chains), chains  # the lock went with the router (ExecStopPost)


def test_a_service_that_takes_the_pd_services_ports_replaces_it_in_one_deploy(
    lab: RunningLab, pd: Pd
) -> None:
    """tiny as 3 replicas, each on the port a replica of tiny-pd holds on its node (8100): the serve stage
    removes the replicas no longer placed whose port a replica placed now takes before any replica starts
    (before, the new replica exited with "Address already in use" and the deploy failed)."""
    back = deploy(pd.inventory, bundle=pd.bundle, stages=["serve"], load=0)  # after the teardown above
    assert back.ok, failures(back)
    assert all(main_pid(lab, host, replica) != "0" for replica, (host, _) in placed(lab).items())
    tiny = {"name": "tiny", "model": TINY, "replicas": 3, "serving": LAB_SERVING}
    replaced = services_inventory(pd.base, pd.folder / "replaced", [tiny], pd.key_file, MORE)
    report = deploy(replaced, bundle=pd.bundle, stages=["serve", "verify"], load=0)
    assert report.ok, failures(report)
    for index, (replica, (host, _)) in enumerate(placed(lab).items()):
        unit = f"gpufleet-vllm@{replica}.service"
        assert lab.ssh(host, ["systemctl", "is-active", unit]).stdout.strip() != "active", unit
        new = f"gpufleet-vllm@tiny-{index}.service"
        assert lab.ssh(host, ["systemctl", "is-active", new]).stdout.strip() == "active", new
        assert (
            "port: 8100" in lab.ssh(host, ["cat", f"/etc/gpufleet/instances/tiny-{index}/vllm.yaml"]).stdout
        )
    edge = f"http://{lab.inventory.hosts[0].ip}:{EDGE_PORT}/v1"
    assert chat(edge, pd.key, "tiny", "Hi")[0] == 200 and chat(edge, pd.key, SERVICE, "Hi")[0] == 404
