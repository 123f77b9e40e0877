"""What clients saw during a change of services (gpufleet.runner.availability): the figures of a request
series, and the load meter against a real HTTP server on loopback that fails requests for a while."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.runner import DeployError, deploy, rollback
from gpufleet.runner.availability import LoadMeter, percentile, summarize
from gpufleet.runner.change_lines import _availability
from gpufleet.runner.facts import PublishedFacts
from gpufleet.runner.report import RollbackReport

REPO = Path(__file__).resolve().parents[2]


def test_failures_are_timed_from_the_change_and_the_longest_gap_runs_between_answers() -> None:
    records = [
        (0.0, 0.1, 200),  # before the change (it began at 1.0)
        (0.5, 0.6, 200),
        (1.0, 1.2, 200),
        (1.3, 1.4, 0),
        (1.5, 1.6, 503),
        (1.7, 4.2, 200),  # the next answer: 3.0 s after the one at 1.2
        (4.3, 4.5, 200),
    ]

    seen = summarize(records, 1.0, 5.0, streams=2, models=["tiny"], answered_before=True)

    assert (seen.requests, seen.failed, seen.failures) == (7, 2, ((0.3, 0), (0.5, 503)))
    assert seen.longest_gap == 3.0
    assert seen.p50_before_ms == 100.0 and seen.p99_before_ms == 100.0
    assert seen.p50_during_ms == 200.0 and seen.p99_during_ms == 2500.0


def test_a_service_that_stops_answering_to_the_end_counts_the_gap_to_the_end() -> None:
    seen = summarize(
        [(1.0, 1.1, 200), (2.0, 2.1, 0)], 1.0, 9.0, streams=1, models=["m"], answered_before=True
    )

    assert seen.longest_gap == 7.9 and seen.failed == 1


def test_percentiles_are_nearest_rank() -> None:
    values = [float(value) for value in range(1, 101)]

    assert (percentile(values, 0.5), percentile(values, 0.99), percentile([], 0.5)) == (50.0, 99.0, None)


class _Edge(http.server.BaseHTTPRequestHandler):
    """An edge that answers chats with 200, or 503 while ``failing`` is set; it records each model asked."""

    failing = threading.Event()
    models: list[str] = []  # noqa: RUF012  (the server's shared record)
    keys: set[str] = set()  # noqa: RUF012

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).models.append(body["model"])
        type(self).keys.add(self.headers.get("Authorization", ""))
        status = 503 if type(self).failing.is_set() else 200
        data = b'{"choices": [{"message": {"content": "hi"}}]}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def edge() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Edge)
    _Edge.failing.clear()
    _Edge.models.clear()
    _Edge.keys.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_the_meter_loads_every_service_with_the_key_and_counts_what_failed(edge: str, tmp_path: Path) -> None:
    key = tmp_path / "gpufleet.apikey"
    key.write_text("k" * 64 + "\n", encoding="utf-8")

    with LoadMeter(edge, key, ["tiny", "tiny-chat"], streams=2, warmup=0.3, interval=0.02) as meter:
        time.sleep(0.3)
        _Edge.failing.set()
        time.sleep(0.3)
        _Edge.failing.clear()
        time.sleep(0.3)
    seen = meter.result()

    assert seen.answered_before and seen.streams == 2 and seen.models == ("tiny", "tiny-chat")
    assert seen.requests > 20 and 0 < seen.failed < seen.requests
    assert {status for _at, status in seen.failures} == {503}
    assert 0.25 <= seen.longest_gap < 1.0  # the 0.3 s without an answer
    assert set(_Edge.models) == {"tiny", "tiny-chat"} and _Edge.keys == {"Bearer " + "k" * 64}
    assert "failed" in str(_availability(seen))


def test_a_service_that_does_not_answer_at_the_start_is_not_loaded(edge: str, tmp_path: Path) -> None:
    """A first deploy: nothing serves yet, so nothing is sent after the first look."""
    _Edge.failing.set()

    with LoadMeter(edge, tmp_path / "missing.apikey", ["tiny"], warmup=0.2, interval=0.01) as meter:
        time.sleep(0.3)
    seen = meter.result()

    assert not seen.answered_before and seen.streams == 0 and seen.requests == 0
    assert len(_Edge.models) == 1
    assert "not measured" in str(_availability(seen))


@pytest.mark.parametrize(
    ("streams", "interval"),
    [(1, 0.0), (2, -1.0), (-1, 0.5), (65, 0.5), (1, 0.001), (1, float("inf")), (1, float("nan")), (1.5, 0.5)],
)
def test_a_load_without_a_pause_is_refused_before_anything_runs(
    streams: int, interval: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[object] = []
    monkeypatch.setattr("gpufleet.runner.api.run_stages", lambda *args: ran.append(args) or ([], {}))
    for call in (deploy, rollback):
        with pytest.raises(DeployError) as refused:
            call(REPO / "inventories" / "prod", load=streams, load_interval=interval)
        message = str(refused.value)
        where = f"deploy()/rollback(): load={streams!r}, load_interval={interval!r}: found"
        assert message.startswith(where), message
        assert "Fix: pass load_interval=0.5" in message
    assert ran == []  # nothing ran on any host


@pytest.mark.parametrize("run", ["deploy", "rollback"])
def test_a_change_of_services_is_measured_through_the_edge_by_deploy_and_by_rollback(
    run: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Lab run of 2026-12-04: `rollback(load=1)` of the services reported no availability at all: it read the
    inventory without validating it, so no typed fleet, no edge, no load. Both runs load inventories/prod's
    services through its edge (the head's cluster address, port 8000) with the streams and pace asked."""
    loads: list[tuple[str, list[str], int, float]] = []

    class Meter:  # a test double of LoadMeter: no edge answers here
        def __init__(self, url: str, _key: Path, models: list[str], *, streams: int, interval: float) -> None:
            loads.append((url, models, streams, interval))

        def __enter__(self) -> Meter:
            return self

        def __exit__(self, *_exc: object) -> None:
            return None

        def result(self) -> None:
            return None

    inventory = tmp_path / "inventories" / "prod"  # a copy (the run locks it), its models beside it
    shutil.copytree(REPO / "inventories" / "prod", inventory)
    (tmp_path / "models").symlink_to(REPO / "models")
    monkeypatch.setattr("gpufleet.runner.api.LoadMeter", Meter)
    monkeypatch.setattr("gpufleet.runner.api.head_marker", lambda *_a, **_k: None)
    monkeypatch.setattr("gpufleet.runner.api.acquire", lambda _marker: [])
    monkeypatch.setattr("gpufleet.runner.api._run", lambda *_a, **_k: ([], PublishedFacts()))
    monkeypatch.setattr(
        "gpufleet.runner.api._rollback", lambda *_a, **_k: RollbackReport(slot="previous", ok=True)
    )
    if run == "deploy":
        deploy(inventory, stages=["serve"], load=1, load_interval=2.0)
    else:
        rollback(inventory, load=1, load_interval=2.0)

    assert loads == [("http://10.10.0.10:8000/v1", ["qwen2.5-1.5b-instruct"], 1, 2.0)]
