"""Services on the end-to-end lab (issue 35; their inventory: gpufleet.lab.inventory.services_inventory):
requests sent on the head through a service's router, and what each replica's vLLM counted."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

LOG = logging.getLogger("gpufleet.tests.services")


class Laps:
    """How long each step of a long lab test took, logged as it ends (``pytest --log-cli-level=INFO`` shows
    it live; a failed test shows it with its captured log): where the suite's minutes go (issue 33)."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def lap(self, step: str, report: Any = None) -> None:
        """Log the time since the last lap; with a deploy() report, each of its stages' seconds too."""
        now = time.monotonic()
        stages = ", ".join(f"{s.name} {s.seconds:.0f} s" for s in report.stages) if report is not None else ""
        LOG.info("%s: %.0f s%s", step, now - self._last, f" ({stages})" if stages else "")
        self._last = now


# On the head (python3 - on stdin): N chat completions through a router on loopback, one after another; the
# key comes on stdin (never in an argv or a log). Prints the HTTP statuses.
REQUESTS_ON_HEAD = """
import json, sys, urllib.error, urllib.request
args = json.load(sys.stdin)
headers = {"Content-Type": "application/json"}
if args["key"]:
    headers["Authorization"] = "Bearer " + args["key"]
body = json.dumps({"model": args["model"], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                   "temperature": 0}).encode()
statuses = []
for _ in range(args["count"]):
    try:
        request = urllib.request.Request(args["url"], data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
            statuses.append(answer.status)
    except urllib.error.HTTPError as error:
        statuses.append(error.code)
    except OSError:
        statuses.append(0)
print(json.dumps(statuses))
"""


# On the head (python3 - on stdin): what each replica's vLLM counted (vllm:request_success_total, every finish
# reason), read from its /metrics: the replicas' ports answer the gateway host, not the control node.
SERVED_ON_HEAD = r"""
import json, re, sys, urllib.request
counted = {}
for name, url in json.load(sys.stdin).items():
    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    counted[name] = int(sum(float(value) for value in found))
print(json.dumps(counted))
"""


def served_on_head(lab: Any, urls: dict[str, str]) -> dict[str, int]:
    """How many requests each replica's vLLM finished, read on the head."""
    head = lab.inventory.hosts[0]
    done = lab.lab.ssh(head.name, ["python3", "-c", SERVED_ON_HEAD], stdin=json.dumps(urls), timeout=120)
    assert done.returncode == 0, done.stderr
    counted: dict[str, int] = json.loads(done.stdout)
    return counted


def procs(lab: Any, host: str, instance: str) -> dict[str, Any]:
    """The instance's `ctl procs`: its processes, the vLLM processes outside it (orphans), GPU memory."""
    done = lab.ssh(host, [f"/etc/gpufleet/instances/{instance}/ctl", "procs"])
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def router_workers(lab: Any, port: int) -> list[str]:
    """The worker URLs a service's vllm-router on the head holds now (its /list_workers, on loopback)."""
    head = lab.inventory.hosts[0]
    read = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/list_workers').read().decode())"
    done = lab.lab.ssh(head.name, ["python3", "-c", read], timeout=60)
    assert done.returncode == 0, done.stderr
    workers: list[str] = json.loads(done.stdout)["urls"]
    return sorted(workers)


# On the head: what a service's vllm-router counted of requests that failed on a worker (its Prometheus
# endpoint on loopback, the port its configuration names): retries, and failures per worker.
ROUTER_FAILURES_ON_HEAD = r"""
import json, re, sys, urllib.request
service = sys.argv[1]
port = json.load(open(f"/etc/gpufleet/gateway/{service}.json"))["service"]["metrics_port"]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
def total(pattern):
    return int(sum(float(value) for value in re.findall(pattern, text, re.M)))
print(json.dumps({
    "retries": total(r"^vllm_router_retries_total\{[^}]*\} ([0-9.e+]+)$"),
    "failures": total(r'^vllm_router_cb_outcomes_total\{[^}]*outcome="failure"[^}]*\} ([0-9.e+]+)$'),
}))
"""


def router_failures(lab: Any, service: str) -> dict[str, int]:
    """How many requests a service's router retried, and how many failed on one of its workers, so far: a
    drained replica gets none while it restarts, so a rolling change adds none."""
    head = lab.inventory.hosts[0]
    done = lab.lab.ssh(head.name, ["python3", "-c", ROUTER_FAILURES_ON_HEAD, service], timeout=60)
    assert done.returncode == 0, done.stderr
    counted: dict[str, int] = json.loads(done.stdout)
    return counted
