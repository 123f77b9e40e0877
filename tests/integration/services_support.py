"""What the two deployed-lab files (test_e2e.py: one instance; test_services.py: services, issue 35) check
alike: requests sent on the head through a service's router and what each replica's vLLM counted, the
instances' units, revisions and images, the routers' and the edge's ports, the lab's Prometheus and the
dashboards' queries. The services' inventory: gpufleet.lab.inventory.services_inventory."""

from __future__ import annotations

import json
import logging
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tests.monitoring_assets import dashboards, metric_names, panel_queries

from gpufleet.lab.upgrade import BROKEN_SUFFIX, UPGRADE_SUFFIX

LOG = logging.getLogger("gpufleet.tests.services")

ROUTER_PORT = 8200  # a service's vllm-router on the head's loopback (the next service's: 8201)
EDGE_PORT = 8080  # the gateway's edge on the head, beside the one instance's vLLM on 8000
PROMETHEUS_PORT = 9090
SERVICES_DASHBOARD = "gpufleet-services.json"  # its panels need services (test_services.py)
# Upgrades and rollbacks (issue 14): a second tag of the lab image, then a broken one. Both are made on the
# head from the lab image and loaded on the workers (gpufleet.lab.upgrade.make_images: only their small parts
# travel), so every node has the same image IDs.
IMAGE = "gpufleet/vllm-cpu:0.32.0"
UPGRADE = IMAGE + UPGRADE_SUFFIX
BROKEN = IMAGE + BROKEN_SUFFIX


class Laps:
    """How long each step of a long lab test took, logged as it ends (``pytest --log-cli-level=INFO`` shows
    it live; a failed test shows it with its captured log) and kept in the test's ``user_properties`` as
    ``("lap", text)``, which the session's summary prints for every test (conftest.py): where the suite's
    minutes go (issue 33)."""

    def __init__(self, properties: list[tuple[str, object]] | None = None) -> None:
        self._last = time.monotonic()
        self._properties = properties if properties is not None else []

    def lap(self, step: str, report: Any = None) -> None:
        """Log the time since the last lap; with a deploy() report, each of its stages' seconds too."""
        now = time.monotonic()
        stages = ", ".join(f"{s.name} {s.seconds:.0f} s" for s in report.stages) if report is not None else ""
        text = f"{step}: {now - self._last:.0f} s" + (f" ({stages})" if stages else "")
        LOG.info("%s", text)
        self._properties.append(("lap", text))
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


def failures(report: Any) -> str:
    """A deploy() or rollback() report's failures, one line: each failed task, then each stage's error."""
    return "; ".join(
        [f"{f.stage}/{f.host}/{f.task}: {f.message}" for f in report.failures]
        + [f"{s.name}: {s.error}" for s in report.stages if s.error]
    )


def replica_images(lab: Any, placed: dict[str, tuple[Any, int]]) -> dict[str, str]:
    """The image ID each replica's own container runs (gpufleet-vllm-ID)."""
    ask = ["docker", "inspect", "--format", "{{.Image}}"]
    return {
        i: lab.ssh(host.name, [*ask, f"gpufleet-vllm-{i}"]).stdout.strip() for i, (host, _) in placed.items()
    }


def post_json(url: str, key: str | None, body: dict[str, Any]) -> int:
    """POST a JSON body (with the key, when given) from this machine: the HTTP status, 0 for no answer."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # the lab network only
            answer.read()
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def replica_revision(lab: Any, host: str, instance: str, slot: str) -> dict[str, Any] | None:
    """What an instance keeps in a revision slot (current, previous), or None."""
    read = lab.ssh(host, ["cat", f"/var/lib/gpufleet/revisions/{instance}/{slot}/revision.json"])
    return json.loads(read.stdout) if read.returncode == 0 else None


def main_pid(lab: Any, host: str, instance: str) -> str:
    """The MainPID systemd gives an instance's unit ("0" when it is not running)."""
    unit = f"gpufleet-vllm@{instance}.service"
    return str(lab.ssh(host, ["systemctl", "show", "-P", "MainPID", unit]).stdout.strip())


def requests_on_head(lab: Any, key: str | None, model: str, port: int, count: int) -> list[int]:
    """``count`` chat completions through the router on the head's ``port``, one after another: statuses."""
    head = lab.inventory.hosts[0]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    request = json.dumps({"key": key, "url": url, "model": model, "count": count})
    done = lab.lab.ssh(head.name, ["python3", "-c", REQUESTS_ON_HEAD], stdin=request, timeout=600)
    assert done.returncode == 0, done.stderr
    statuses: list[int] = json.loads(done.stdout)
    return statuses


def ray_started(lab: Any) -> dict[str, str]:
    """When each host's Ray container unit last became active (changes with every restart of it)."""
    ask = ["systemctl", "show", "--property=ActiveEnterTimestampMonotonic", "--value", "gpufleet-ray.service"]
    return {host: lab.ssh(host, ask).stdout.strip() for host in lab.hosts}


# ----- the lab's Prometheus (the optional monitoring stage, on in both files' deploys)


def prometheus(head_ip: str, path: str, **params: str) -> Any:
    """The data of a Prometheus API answer on the head (asserting success)."""
    url = f"http://{head_ip}:{PROMETHEUS_PORT}{path}" + (
        f"?{urllib.parse.urlencode(params)}" if params else ""
    )
    with urllib.request.urlopen(url, timeout=30) as response:  # the lab network only
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def all_queries(only: frozenset[str] | None = None) -> list[tuple[str, str]]:
    """(panel title, query as Grafana sends it) of every panel (of the dashboards ``only`` names): interval
    macros and each query variable at its "All" value filled in."""
    queries = []
    for file, dashboard in dashboards().items():
        if only is not None and file not in only:
            continue
        listed = dashboard.get("templating", {}).get("list", [])
        variables = [variable["name"] for variable in listed if variable["type"] == "query"]
        for title, panel_expr in panel_queries(dashboard):
            expr = panel_expr
            for macro, value in (("$__rate_interval", "1m"), ("$__interval", "15s"), ("$__range", "5m")):
                expr = expr.replace(macro, value)
            for name in variables:
                expr = re.sub(rf"\$\{{?{name}(:\w+)?\}}?(?!\w)", ".*", expr)
            queries.append((title, expr))
    return queries


def empty_panels(head_ip: str, only: frozenset[str]) -> list[str]:
    """The panels of these dashboards whose query the lab's Prometheus answers with no finite value."""
    empty = []
    for title, expr in all_queries(only):
        result = prometheus(head_ip, "/api/v1/query", query=expr)["result"]
        if any(name.startswith("DCGM_") for name in metric_names(expr)):
            continue  # accepted by Prometheus (prometheus() asserts success); no GPU in the lab to give data
        values = [float(sample["value"][1]) for sample in result]
        if not any(math.isfinite(value) for value in values):
            empty.append(f"{title}: {expr} -> {values}")
    return empty
