"""How long a client waits when a replica's node is lost, measured on the pinned vllm-router alone.

    sudo .venv/bin/python benchmarks/router_failover.py [--rounds 3] [--wheel PATH] \
        [--markdown benchmarks/results/router-failover.md]

The router is the real one: the pinned wheel (``--wheel``; by default the lab bundle's,
``~/.cache/gpufleet/lab-bundle/gateway``), unpacked and started by the gateway role's own launcher
(``roles/gateway/files/gpufleet_router.py``) with the arguments the role renders for a regular service (its
template rendered with its defaults: round robin, a health check every second, out after 2
failures, the circuit breaker's timeout). Its three replicas are TEST DOUBLES of vLLM's OpenAI server (a
Python HTTP server answering ``/health``, ``/v1/models`` and every POST after ``--service-time`` seconds, with
its own name in the answer): what is measured is the router, so no model runs. Each sits in a network
namespace of its own on a bridge, as the lab's hosts do; the router in another. A node is "lost" as
``Lab.power_off`` takes it: its link deleted first (its address stops answering; no RST, no FIN), then its
process killed.

Per round, a fresh router and replicas, two cases:

- ``in_flight``: a request is being served by the victim when its node is lost: how long until the client's
  answer, its status, and which replica gave it.
- ``routed_after``: the victim's node is lost while the router is idle, then a stream of requests (one per
  0.5 s, 30 s): each request's time; those longer than 3 service times waited on the lost replica.

Loopback and the namespaces' own addresses only; everything started here is stopped, and the namespaces
removed, at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpufleet.runner.availability import TIMEOUT as CLIENT_TIMEOUT  # as long as the runner's meter waits

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "gateway"
LAUNCHER = ROLE / "files" / "gpufleet_router.py"
WHEEL_NAME = "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "gpufleet/lab-bundle/gateway"
    / WHEEL_NAME
)
PREFIX = "gfrf"  # the namespaces and links of this benchmark: gfrf-br, gfrf-r, gfrf-1..3
SUBNET = "10.253.77"
ROUTER_IP, ROUTER_PORT, WORKER_PORT = f"{SUBNET}.1", 8200, 8100
WORKERS = {f"w{index}": f"{SUBNET}.{index + 1}" for index in (1, 2, 3)}
VICTIM = "w3"
CLONE_NEWNET = 0x40000000

# A TEST DOUBLE of a vLLM replica's OpenAI server: the router only needs /health and an answer per request
REPLICA = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
NAME, DELAY = sys.argv[2], float(sys.argv[3])
class Replica(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5  # idle keep-alive connections closed after 5 s, as uvicorn (vLLM's server) does
    def log_message(self, *args): pass
    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        models = {"object": "list", "data": [{"id": "tiny", "object": "model"}]}
        self.answer(models if "models" in self.path else {})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(DELAY)
        self.answer({"object": "chat.completion", "model": "tiny", "replica": NAME, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}]})
ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Replica).serve_forever()
"""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", f"{PREFIX}-{ns}", *args]


def link(ns: str, address: str) -> None:
    """ns's link to the bridge (its end ``eth0`` with ``address``; the bridge's end ``PREFIX-ns``)."""
    end = f"{PREFIX}-{ns}"  # made in the bridge's namespace, its peer moved to ns's as eth0
    sh(*in_ns("br", "ip", "link", "add", end, "type", "veth", "peer", "name", "eth0", "netns", end))
    sh(*in_ns("br", "ip", "link", "set", end, "master", "br0", "up"))
    sh(*in_ns(ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0"))
    sh(*in_ns(ns, "ip", "link", "set", "eth0", "up"))


def setns(path: str) -> None:
    """This thread (and every thread it starts after) into the network namespace at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")


@contextlib.contextmanager
def network() -> Iterator[None]:
    """The bridge, the router's and the replicas' namespaces; this process inside the router's while it runs
    (its requests reach the namespaces' bridge and nothing else)."""
    names = ["br", "r", *WORKERS]
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    if any(line.split()[0] in {f"{PREFIX}-{name}" for name in names} for line in existing.splitlines()):
        raise SystemExit(
            f"{PREFIX}-* namespaces exist: another run of this benchmark, or one left; remove them"
        )
    try:
        for name in names:
            sh("ip", "netns", "add", f"{PREFIX}-{name}")
            sh(*in_ns(name, "ip", "link", "set", "lo", "up"))
        sh(*in_ns("br", "ip", "link", "add", "br0", "type", "bridge"))
        sh(*in_ns("br", "ip", "link", "set", "br0", "up"))
        link("r", ROUTER_IP)
        for name, address in WORKERS.items():
            link(name, address)
        with open("/proc/self/ns/net", "rb") as own:
            setns(f"/run/netns/{PREFIX}-r")
            try:
                yield
            finally:
                setns(f"/proc/self/fd/{own.fileno()}")
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", f"{PREFIX}-{name}"], capture_output=True, check=False)


def gateway_args() -> list[str]:
    """The arguments the gateway role renders for a regular service of the three replicas: its own template
    (``router.json.j2``) and variables (defaults, then vars), through Ansible's Templar; the gateway host is
    the router's address here."""
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415  (ansible-core, as the role renders)
    from ansible.template import Templar, trust_as_template  # noqa: PLC0415

    loader, variables = DataLoader(), dict[str, Any]()
    for path in (ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml"):
        loaded = loader.load_from_file(str(path))
        variables |= {name: trust_as_template(v) if isinstance(v, str) else v for name, v in loaded.items()}
    workers = [f"http://{address}:{WORKER_PORT}" for address in WORKERS.values()]
    service = {"name": "tiny", "port": ROUTER_PORT, "metrics_port": 29201, "workers": workers}
    variables |= {"gateway_host": ROUTER_IP, "__gateway_wheel": {"sha256": "0" * 64}, "item": service}
    template = trust_as_template((ROLE / "templates" / "router.json.j2").read_text(encoding="utf-8"))
    rendered = Templar(loader=loader, variables=variables).template(template)
    return [str(arg) for arg in json.loads(rendered)["args"]]


def chat() -> tuple[float, int, str]:
    """One chat through the router: (seconds, HTTP status or 0, the replica that answered or the error)."""
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    url = f"http://{ROUTER_IP}:{ROUTER_PORT}/v1/chat/completions"
    request = urllib.request.Request(url, body.encode(), {"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT) as response:  # the benchmark's netns
            replica = str(json.loads(response.read()).get("replica"))
            return time.monotonic() - start, int(response.status), replica
    except urllib.error.HTTPError as error:
        return time.monotonic() - start, int(error.code), "router"
    except OSError as error:
        return time.monotonic() - start, 0, type(error).__name__


class Round:
    """A router and its three replicas, started; :meth:`lose` takes the victim's node away."""

    def __init__(self, folder: Path, service_time: float) -> None:
        """Started from ``folder``: the unpacked wheel, ``replica.py``, ``router.json`` (:func:`prepare`)."""
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        bridge = subprocess.run(
            in_ns("br", "ip", "link", "show", f"{PREFIX}-{VICTIM}"), capture_output=True, check=False
        )
        if bridge.returncode != 0:  # the last round took it away: plugged in again (a fresh MAC)
            link(VICTIM, WORKERS[VICTIM])
        sh(*in_ns("r", "ip", "neigh", "flush", "all"))
        script, config = folder / "replica.py", folder / "router.json"
        for name in WORKERS:
            command = in_ns(name, sys.executable, str(script), str(WORKER_PORT), name, str(service_time))
            self.processes[name] = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        with (folder / "router.log").open("ab") as log:
            command = in_ns("r", sys.executable, "-s", str(LAUNCHER), str(config))
            self.processes["router"] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while {chat()[2] for _ in range(3)} != set(WORKERS):  # every replica answers through the router
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"the router did not route to all of {sorted(WORKERS)} in 60 s")
            time.sleep(0.5)

    def lose(self) -> None:
        """The victim's node loses power: its link first (its address stops answering), then its process."""
        sh(*in_ns("br", "ip", "link", "del", f"{PREFIX}-{VICTIM}"))
        self.processes[VICTIM].kill()

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def in_flight(folder: Path, service_time: float) -> dict[str, Any]:
    """A request is being served on the victim when its node is lost."""
    trip = Round(folder, service_time)
    try:
        for _ in range(6):  # round robin: the request after the victim's answer and two more is the victim's
            if chat()[2] == VICTIM:
                break
        chat(), chat()
        found: dict[str, Any] = {}
        waiting = threading.Thread(
            target=lambda: found.update(zip(("seconds", "status", "replica"), chat(), strict=True))
        )
        waiting.start()
        time.sleep(service_time / 3)
        trip.lose()
        waiting.join(CLIENT_TIMEOUT + 5)
        found["lost_after_s"] = round(service_time / 3, 2)
        found["seconds"] = round(found.get("seconds", 0.0), 2)
        return found
    finally:
        trip.close()


def routed_after(folder: Path, service_time: float, seconds: float = 30.0) -> dict[str, Any]:
    """The victim's node is lost while the router is idle, then a paced stream of requests."""
    trip = Round(folder, service_time)
    try:
        trip.lose()
        lost = time.monotonic()
        done: list[tuple[float, float, int, str]] = []
        while time.monotonic() - lost < seconds:
            start = time.monotonic() - lost
            took, status, replica = chat()
            done.append((round(start, 2), round(took, 2), status, replica))
            time.sleep(max(0.0, 0.5 - took))
        stalled = [entry for entry in done if entry[1] > 3 * service_time]
        return {
            "requests": len(done),
            "failed": sum(1 for entry in done if entry[2] != 200),
            "stalled": [{"sent_s": s, "seconds": t, "status": c, "replica": r} for s, t, c, r in stalled],
            "to_victim": sum(1 for entry in done if entry[3] == VICTIM),
        }
    finally:
        trip.close()


def prepare(folder: Path, wheel: Path, router_args: list[str]) -> None:
    """What every round starts from: the wheel unpacked, the replica double's script, the router's config."""
    with zipfile.ZipFile(wheel) as unpacked:
        unpacked.extractall(folder / "wheel")
    (folder / "replica.py").write_text(REPLICA, encoding="utf-8")
    config = {"path": str(folder / "wheel"), "args": router_args}
    (folder / "router.json").write_text(json.dumps(config), encoding="utf-8")


def markdown(results: dict[str, Any]) -> str:
    rounds = results["rounds"]
    waits = [r["in_flight"]["seconds"] for r in rounds]
    stalls = [s["seconds"] for r in rounds for s in r["routed_after"]["stalled"]]
    lines = [
        "# The router when a replica's node is lost (vllm-router 0.1.17, replicas as test doubles)\n",
        f"{results['date']}, {results['cpus']} CPUs, `benchmarks/router_failover.py` ({len(rounds)} rounds, "
        f"a replica answers after {results['service_time_s']} s; the gateway role's router arguments: "
        f"`{' '.join(results['router_args'])}`).\n",
        "| round | in flight: the client's answer after (s) | status | answered by | lost, then a request "
        "each 0.5 s for 30 s: requests / failed | those that waited (s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for index, entry in enumerate(rounds, 1):
        flight, after = entry["in_flight"], entry["routed_after"]
        waited = ", ".join(str(s["seconds"]) for s in after["stalled"]) or "none"
        lines.append(
            f"| {index} | {flight['seconds']} | {flight.get('status')} | {flight.get('replica')} | "
            f"{after['requests']} / {after['failed']} | {waited} |"
        )
    lines.append(
        f"\nIn flight: median {statistics.median(waits):.1f} s; routed to the lost replica before the health "
        f"check took it out: {', '.join(f'{s:.1f}' for s in stalls) or 'none'} s.\n"
    )
    return "\n".join(lines) + "\nRaw:\n\n```json\n" + json.dumps(results, indent=1) + "\n```\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wheel", type=Path, default=WHEEL)
    parser.add_argument("--service-time", type=float, default=1.5, help="a replica's time per request (s)")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark makes network namespaces")
    service_time = min(max(args.service_time, 0.3), 10.0)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "wheel": args.wheel.name,
        "service_time_s": service_time,
        "router_args": gateway_args(),
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="gpufleet-failover-") as temp, network():
        folder = Path(temp)
        prepare(folder, args.wheel, results["router_args"])
        for _ in range(min(max(args.rounds, 1), 10)):
            results["rounds"].append(
                {
                    "in_flight": in_flight(folder, service_time),
                    "routed_after": routed_after(folder, service_time),
                }
            )
            print(json.dumps(results["rounds"][-1]), flush=True)
    if args.markdown:
        args.markdown.write_text(markdown(results), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
