"""The downtime of a change, measured from the control node: the endpoint polled while the stages run.

A probe is ``GET /v1/models`` with the API key (what a client needs: the server up and the key accepted),
every ``interval`` seconds with a ``timeout``. An outage starts at the first failed probe after a good one and
ends at the next good one (or at the last probe, when none came). The figure is as fine as the interval.
Where the service answers is the fleet's: :attr:`gpufleet.fleet.Fleet.endpoint`.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from gpufleet.runner.measured import Downtime

INTERVAL = 1.0
TIMEOUT = 2.0


def measure(probes: Sequence[tuple[float, bool]], interval: float = INTERVAL) -> Downtime:
    """Outages in a series of (monotonic time, answered) probes, in time order."""
    outages: list[float] = []
    seen_good = False
    down_since: float | None = None
    for at, good in probes:
        if good:
            if down_since is not None:
                outages.append(at - down_since)
                down_since = None
            seen_good = True
        elif seen_good and down_since is None:
            down_since = at
    if down_since is not None:
        outages.append(probes[-1][0] - down_since)
    return Downtime(
        seconds=round(sum(outages), 1),
        longest=round(max(outages, default=0.0), 1),
        outages=len(outages),
        answered_before=bool(probes) and probes[0][1],
        answers_after=bool(probes) and probes[-1][1],
        probes=len(probes),
        interval=interval,
    )


class DowntimeMeter:
    """Polls ``url``/models in a thread for the length of a ``with`` block; :meth:`result` measures it."""

    def __init__(
        self, url: str, key_file: Path, interval: float = INTERVAL, timeout: float = TIMEOUT
    ) -> None:
        self._url, self._key_file = url.rstrip("/") + "/models", key_file
        self._interval, self._timeout = interval, timeout
        self._probes: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gpufleet-downtime", daemon=True)

    def __enter__(self) -> DowntimeMeter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(self._timeout + self._interval + 1)

    def probe(self) -> bool:
        try:
            key = self._key_file.read_text(encoding="utf-8").strip()
        except OSError:
            key = ""
        request = urllib.request.Request(self._url, headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return bool(response.status == 200)
        except Exception:  # any failed probe is an outage; the thread must outlive it
            return False

    def _poll(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            good = self.probe()
            self._probes.append((started, good))
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def result(self) -> Downtime:
        return measure(list(self._probes), self._interval)
