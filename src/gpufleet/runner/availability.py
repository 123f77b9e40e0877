"""What clients saw while a change ran: a small steady load through the gateway's edge (services).

deploy() and rollback() of an inventory with services send, from the control node, a bounded load of short
chats (``max_tokens`` 4, temperature 0) to every service through the edge while the stages run: ``streams``
concurrent streams, each one request after another (at most one per ``interval`` seconds), the services
taken in turn. The first ``warmup`` seconds, before any stage starts, give the latency before the change.
:meth:`LoadMeter.result` reports the requests sent and failed (each failure's time after the change began and
its HTTP status, 0 for no answer), the longest gap between two answers, and latency p50/p99 before and during.
A service that does not answer during the warmup (a first deploy) is not loaded: the report says so. The load
goes to the fleet's own edge only, and stops at :data:`MAX_REQUESTS`.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from gpufleet.runner.measured import Availability

STREAMS = 2
MAX_STREAMS = 64  # deploy()/rollback() and the CLI refuse more: a measure, not a load test
MIN_INTERVAL = 0.05  # seconds: at most 20 requests a second per stream
MAX_INTERVAL = 600.0
WARMUP = 3.0
INTERVAL = 0.5
TIMEOUT = 120.0
MAX_REQUESTS = 20000


def chat(url: str, key: str, model: str, timeout: float = TIMEOUT) -> int:
    """One short chat to ``url`` (``.../v1``) with the key: its HTTP status, 0 when nothing answered."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    body["temperature"] = 0
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    address = f"{url.rstrip('/')}/chat/completions"
    request = urllib.request.Request(address, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # the fleet's own edge
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except Exception:  # any request that got no answer counts as failed; the stream must outlive it
        return 0


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The ``fraction`` quantile of ``values`` (nearest rank), None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def summarize(
    records: Sequence[tuple[float, float, int]],
    began: float,
    ended: float,
    *,
    streams: int,
    models: Sequence[str],
    answered_before: bool,
) -> Availability:
    """Availability from (start, end, status) of each request; ``began`` and ``ended``: when the change
    began and ended (the same clock). A gap runs from one answer (or the change's start) to the next (or its
    end)."""
    ok_ends = sorted(end for _start, end, status in records if began <= end <= ended and status == 200)
    edges = [began, *ok_ends, ended] if records else []
    gaps = [later - earlier for earlier, later in itertools.pairwise(edges)]
    before = [(end - start) * 1000 for start, end, status in records if status == 200 and end < began]
    during = [(end - start) * 1000 for start, end, status in records if status == 200 and end >= began]
    failures = tuple(
        (round(max(0.0, start - began), 1), status)
        for start, _end, status in sorted(records)
        if status != 200
    )

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return Availability(
        streams=streams,
        models=tuple(models),
        answered_before=answered_before,
        requests=len(records),
        failed=len(failures),
        failures=failures[:50],
        longest_gap=round(max(gaps, default=0.0), 1),
        p50_before_ms=ms(statistics.median(before) if before else None),
        p99_before_ms=ms(percentile(before, 0.99)),
        p50_during_ms=ms(statistics.median(during) if during else None),
        p99_during_ms=ms(percentile(during, 0.99)),
    )


class LoadMeter:
    """Loads ``url`` (the edge, ``.../v1``) for the length of a ``with`` block; :meth:`result` sums it up."""

    def __init__(
        self,
        url: str,
        key_file: Path,
        models: Sequence[str],
        *,
        streams: int = STREAMS,
        warmup: float = WARMUP,
        interval: float = INTERVAL,
        timeout: float = TIMEOUT,
    ) -> None:
        self._url, self._key_file, self._models = url, key_file, tuple(models)
        self._streams, self._warmup, self._interval, self._timeout = streams, warmup, interval, timeout
        self._records: list[tuple[float, float, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._turn = itertools.count()
        self._threads = [
            threading.Thread(target=self._stream, name=f"gpufleet-load-{index}", daemon=True)
            for index in range(streams)
        ]
        self._began = self._ended = 0.0
        self._answered_before = False

    def __enter__(self) -> LoadMeter:
        self._key = self._read_key()
        # one request to each service first: a service that does not answer now is not loaded
        self._answered_before = bool(self._models) and all(
            chat(self._url, self._key, model, timeout=10.0) == 200 for model in self._models
        )
        if self._answered_before:
            for thread in self._threads:
                thread.start()
            self._stop.wait(self._warmup)
        self._began = time.monotonic()
        return self

    def __exit__(self, *_: object) -> None:
        self._ended = time.monotonic()
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(self._timeout + 1)

    def result(self) -> Availability:
        with self._lock:
            records = list(self._records)
        return summarize(
            records,
            self._began,
            self._ended or time.monotonic(),
            streams=self._streams if self._answered_before else 0,
            models=self._models,
            answered_before=self._answered_before,
        )

    def _read_key(self) -> str:
        try:
            return self._key_file.read_text(encoding="utf-8").strip()
        except OSError:
            return ""

    def _stream(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if len(self._records) >= MAX_REQUESTS:
                    return
                model = self._models[next(self._turn) % len(self._models)]
            start = time.monotonic()
            status = chat(self._url, self._key, model, timeout=self._timeout)
            end = time.monotonic()
            with self._lock:
                self._records.append((start, end, status))
            self._stop.wait(max(0.0, self._interval - (end - start)))
