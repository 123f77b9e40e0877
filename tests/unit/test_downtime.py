"""The downtime of a change (gpufleet.runner.downtime): outages in a probe series, the endpoint the
inventory sets, and the meter against a real HTTP server on loopback that stops answering for a while."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.fleet import load
from gpufleet.runner.downtime import DowntimeMeter, measure

from .conftest import PD_INVENTORY


def test_an_outage_runs_from_the_first_failed_probe_to_the_next_answer() -> None:
    probes = [(0.0, True), (1.0, True), (2.0, False), (3.0, False), (4.0, False), (5.0, True), (6.0, True)]

    downtime = measure(probes)

    assert (downtime.seconds, downtime.outages, downtime.longest) == (3.0, 1, 3.0)
    assert downtime.answered_before and downtime.answers_after and downtime.probes == 7


def test_outages_add_up_and_one_still_open_at_the_end_counts_to_the_last_probe() -> None:
    probes = [(0.0, True), (1.0, False), (2.0, True), (3.0, False), (4.0, False), (5.5, False)]

    downtime = measure(probes)

    assert (downtime.seconds, downtime.outages, downtime.longest) == (3.5, 2, 2.5)
    assert not downtime.answers_after


def test_a_service_that_was_not_up_before_has_no_outage() -> None:
    """A first deploy: the endpoint answers only at the end; nothing was interrupted."""
    downtime = measure([(0.0, False), (1.0, False), (2.0, True)])

    assert (downtime.seconds, downtime.outages) == (0.0, 0)
    assert not downtime.answered_before and downtime.answers_after


def test_no_probes_measure_nothing() -> None:
    downtime = measure([])

    assert (downtime.seconds, downtime.probes, downtime.answered_before) == (0.0, 0, False)


def inventory(tmp_path: Path, head_vars: str) -> Path:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text(
        "all:\n  children:\n    gpu_nodes:\n      children:\n        ray_head:\n          hosts:\n"
        f"            node1: {{gpufleet_node_ip: 10.0.0.11{head_vars}}}\n"
        "        ray_workers:\n          hosts:\n            node2: {gpufleet_node_ip: 10.0.0.12}\n",
        encoding="utf-8",
    )
    return hosts


def test_the_endpoint_is_the_heads_cluster_address_and_the_key_beside_the_inventory(tmp_path: Path) -> None:
    hosts = inventory(tmp_path, "")

    want = ("http://10.0.0.11:8000/v1", tmp_path / "gpufleet.apikey")
    assert load(hosts, validate=False).endpoint == want


def test_the_endpoint_follows_the_inventorys_port_bind_address_and_key_file(tmp_path: Path) -> None:
    hosts = inventory(
        tmp_path, ", vllm_service_port: 9000, vllm_service_host: 10.9.9.9, gpufleet_api_key_file: /keys/k"
    )

    assert load(hosts, validate=False).endpoint == ("http://10.9.9.9:9000/v1", Path("/keys/k"))


def test_a_prefill_decode_services_endpoint_is_the_gateways_edge_on_the_head() -> None:
    """A P/D service answers where every service does, at the gateway's edge on the head (its router in P/D
    mode behind it); its replicas' vLLM ports are not the service. Before P/D services, a proxy on the head
    served it, and the meter once polled vllm_service_port there."""
    want = ("http://10.10.0.11:8000/v1", PD_INVENTORY / "gpufleet.apikey")
    assert load(PD_INVENTORY).edge == want


class _Flaky(http.server.BaseHTTPRequestHandler):
    """/v1/models: 200 with the right key while ``up`` is set, else 503."""

    up = threading.Event()

    def do_GET(self) -> None:
        good = self.up.is_set() and self.headers.get("Authorization") == "Bearer sekrit"
        self.send_response(200 if good else 503)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()


def test_the_meter_measures_a_real_outage(server: str, tmp_path: Path) -> None:
    key = tmp_path / "gpufleet.apikey"
    key.write_text("sekrit\n", encoding="utf-8")
    _Flaky.up.set()
    with DowntimeMeter(server, key, interval=0.1, timeout=1.0) as meter:
        time.sleep(0.5)
        _Flaky.up.clear()
        time.sleep(1.0)
        _Flaky.up.set()
        time.sleep(0.5)
    downtime = meter.result()

    assert downtime.answered_before and downtime.answers_after
    assert downtime.outages == 1
    assert 0.8 <= downtime.seconds <= 1.4, downtime


def test_a_wrong_key_is_an_outage(server: str, tmp_path: Path) -> None:
    """The probe is what a client needs: the server up and the key accepted."""
    key = tmp_path / "gpufleet.apikey"
    key.write_text("sekrit", encoding="utf-8")
    _Flaky.up.set()
    with DowntimeMeter(server, key, interval=0.1, timeout=1.0) as meter:
        time.sleep(0.3)
        key.write_text("wrong", encoding="utf-8")
        time.sleep(0.5)
    downtime = meter.result()

    assert downtime.answered_before and not downtime.answers_after and downtime.outages == 1
