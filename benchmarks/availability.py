"""What a replica's crash, and a rolling change, cost a service behind the gateway (issue 36), on the lab.

    make demo      # the lab "demo", left up: tiny as 3 replicas (one per host) behind the edge
    sudo .venv/bin/python benchmarks/availability.py [--name demo] [--streams 4] [--seconds 90] \
        [--kill-at 10] [--markdown benchmarks/results/availability.md]
    sudo .venv/bin/python benchmarks/availability.py --rolling [--streams 4] [--interval 0.5] \
        [--markdown FILE]
    sudo .venv/bin/python benchmarks/availability.py --lost-host [--streams 1] [--seconds 90]

``--rolling``: an upgrade of tiny to a second tag of the lab image (``gpufleet.lab.upgrade``: a label more,
made on the hosts from the lab image; each replica runs its image by ID in a container of its own) with a
change of its settings (``max_num_seqs``), a ``gpufleet.runner.deploy`` of the serve and verify stages, then
back with ``gpufleet.runner.rollback``: tiny's 3 replicas change (and go back) one node at a time, each
drained from its router, restarted, gated and put back, while the run's own load (``load``: the streams, 0 for
none; ``load_interval``: at most one request per ``--interval`` seconds on each) goes through the edge;
reported: the run's time, requests sent and failed, the longest gap between answers and latency p50/p99 before
and during, from the report's ``availability``.

A steady, bounded load from this machine through the edge (``--streams`` concurrent streams of 4-token chats
to ``tiny``, one after another on each stream) runs for ``--seconds``; at ``--kill-at`` the `vllm serve`
process tree of tiny's replica off the head (tiny-1) gets SIGKILL. systemd restarts the replica (its unit's
``Restart=``), the router's health check and circuit breaker take it out and back in (the gateway role's
``gateway_health_check_interval``, ``gateway_health_failure_threshold``, ``gateway_circuit_breaker_timeout``).
Reported: requests sent and failed (each failure's time after the kill), the longest gap between two answers,
latency p50/p99 before and after the kill, when the killed replica listed its model again (asked from the
head, its gateway host) and when it served a request again (its own ``vllm:request_success_total``).
``--lost-host``: the same load, but at ``--kill-at`` the victim's whole node loses power (``Lab.power_off``:
every process killed, its address gone); after the load it boots again and the next whole deploy (paced, one
stream at one request per 2 s) restores it: its time and each replica's served count after it are reported
(printed as JSON; ``--markdown`` writes the kill's table only).
Loopback and the lab's addresses only; every run is bounded in time and requests.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpufleet.lab import Lab
from gpufleet.lab.demo import route_to_bridge
from gpufleet.lab.state import lab_dir
from gpufleet.runner.availability import TIMEOUT

MAX_REQUESTS = 20000
# On the head: each URL's vllm:request_success_total, or -1 when it does not answer (stdin: {name: URL})
COUNTERS = r"""
import json, re, sys, urllib.request
out = {}
for name, url in json.load(sys.stdin).items():
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=2) as answer:
            text = answer.read().decode()
        found = re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
        out[name] = int(sum(float(value) for value in found))
    except OSError:
        out[name] = -1
print(json.dumps(out))
"""


def chat(url: str, key: str) -> int:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    request = urllib.request.Request(f"{url}/chat/completions", json.dumps(body).encode(), headers)
    try:
        # the runner's LoadMeter's timeout: a request the router holds on a lost node answers after ~45 s
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # the lab network only
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def load(url: str, key: str, streams: int, seconds: float) -> list[tuple[float, float, int]]:
    """(start, end, HTTP status or 0) of every request, times from the load's start."""
    done: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    origin = time.monotonic()

    def stream() -> None:
        while time.monotonic() - origin < seconds and len(done) < MAX_REQUESTS:
            start = time.monotonic() - origin
            status = chat(url, key)
            with lock:
                done.append((start, time.monotonic() - origin, status))

    threads = [threading.Thread(target=stream) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(done)


def counters(lab: Lab, head: str, urls: dict[str, str]) -> dict[str, int]:
    done = lab.ssh(head, ["python3", "-c", COUNTERS], stdin=json.dumps(urls), timeout=60)
    return dict(json.loads(done.stdout)) if done.returncode == 0 else {name: -1 for name in urls}


def run(  # noqa: PLR0915  (one measured scenario, its steps in order)
    name: str, streams: int, seconds: float, kill_at: float, edge_port: int, *, lost_host: bool = False
) -> dict[str, Any]:
    from gpufleet.fleet import load_fleet  # noqa: PLC0415  (imports ansible)
    from gpufleet.fleet.services import place_fleet  # noqa: PLC0415

    lab = Lab(name)
    inventory = lab_dir(name) / "inventory" / "services"  # make demo's services (gpufleet.lab.demo)
    key = (inventory / "gpufleet.apikey").read_text(encoding="utf-8").strip()
    fleet = load_fleet(inventory)
    ips = {node.name: str(node.node_ip) for node in fleet.nodes}
    head = fleet.head.name
    replicas = {r.id: r for r in place_fleet(fleet).of("tiny")}
    victim = next(r for r in replicas.values() if r.node != head)
    urls = {rid: f"http://{ips[r.node]}:{r.port}" for rid, r in replicas.items()}
    edge = f"http://{ips[head]}:{edge_port}/v1"

    before = counters(lab, head, urls)
    found: dict[str, Any] = {}

    def kill() -> None:
        time.sleep(kill_at)
        found["killed_at"] = kill_at
        if lost_host:  # the whole node, as a machine losing power: its address stops answering
            try:
                lab.power_off(victim.node)
                found["kill_rc"] = 0
            except Exception as error:  # reported, and no power_on of a host that may still run
                found["kill_rc"], found["power_off_error"] = 1, str(error)
            return
        pattern = f"serve --config /etc/gpufleet/instances/{victim.id}/"
        found["kill_rc"] = lab.ssh(victim.node, ["pkill", "-KILL", "-f", pattern], timeout=30).returncode
        killed = time.monotonic()
        served = counters(lab, head, {victim.id: urls[victim.id]})[victim.id]
        while time.monotonic() - killed < seconds:
            now = counters(lab, head, {victim.id: urls[victim.id]})[victim.id]
            if now >= 0 and "answering_after_s" not in found:
                found["answering_after_s"] = round(time.monotonic() - killed, 1)
                served = now
            if "answering_after_s" in found and now > served:
                found["served_again_after_s"] = round(time.monotonic() - killed, 1)
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill)
    killer.start()
    requests = load(edge, key, streams, seconds)
    killer.join()
    after = counters(lab, head, urls)
    if lost_host and found.get("kill_rc") == 0:  # back: it boots from its disk; the next deploy restores it
        lab.power_on(victim.node)
        route_to_bridge(lab, lab.inventory())  # the default route make demo gave its hosts (dropped there)
        from gpufleet.runner import deploy  # noqa: PLC0415  (imports ansible)

        bundle = Path(__file__).resolve().parents[1] / "dist" / "lab-bundle"  # make demo's
        restored = deploy(inventory, bundle=bundle if bundle.is_dir() else None, load=1, load_interval=2.0)
        found["lost_host"] = victim.node
        found["next_deploy"] = {"ok": restored.ok, "seconds": restored.seconds}
        found["after_deploy"] = counters(lab, head, urls)
    failed = [(round(start - kill_at, 2), status) for start, _, status in requests if status != 200]
    answers = sorted(end for _, end, status in requests if status == 200)
    gaps = [b - a for a, b in itertools.pairwise(answers)]

    def percentiles(chosen: list[float]) -> dict[str, float]:
        if not chosen:
            return {}
        ordered = sorted(chosen)
        return {
            "p50_ms": round(1000 * statistics.median(ordered), 1),
            "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1),
        }

    ok = [(start, end) for start, end, status in requests if status == 200]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "streams": streams,
        "seconds": seconds,
        "victim": {"id": victim.id, "node": victim.node},
        "what": "the node powered off" if lost_host else "SIGKILL to the replica's vllm serve",
        "requests": len(requests),
        "failed": len(failed),
        "failures_s_after_kill_and_status": failed[:50],
        "longest_gap_s": round(max(gaps), 2) if gaps else None,
        "latency_before_kill": percentiles([end - start for start, end in ok if end < kill_at]),
        "latency_after_kill": percentiles([end - start for start, end in ok if start >= kill_at]),
        "served_per_replica": {rid: after[rid] - before[rid] for rid in urls},
        **found,
    }


def rolling(name: str, streams: int, interval: float) -> dict[str, Any]:
    """A rolling upgrade of tiny (a second image tag, a setting) through deploy(), then `gpufleet rollback`
    of it (rollback()), each measured by its load."""
    import shutil  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    from gpufleet.lab.upgrade import UPGRADE_SUFFIX, make_images  # noqa: PLC0415
    from gpufleet.runner import deploy, rollback  # noqa: PLC0415  (imports ansible)

    inventory = lab_dir(name) / "inventory" / "services"
    changed = inventory.parent / "services-rolling"
    shutil.rmtree(changed, ignore_errors=True)
    shutil.copytree(inventory, changed)
    group_vars = changed / "group_vars" / "gpu_nodes.yml"
    values = yaml.safe_load(group_vars.read_text(encoding="utf-8"))
    tiny = next(service for service in values["gpufleet_services"] if service["name"] == "tiny")
    tiny["serving"] = {**tiny.get("serving", {}), "max_num_seqs": 8}
    base = str(values["ray_cluster_image"])  # the lab's serving image, the fleet's
    make_images(Lab(name), base)
    tiny["image"] = base + UPGRADE_SUFFIX
    values["gpufleet_api_key_file"] = str(inventory / "gpufleet.apikey")
    group_vars.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    bundle = Path(__file__).resolve().parents[1] / "dist" / "lab-bundle"  # make demo's
    runs = []
    for label in (f"image {tiny['image']}, max_num_seqs 8", "gpufleet rollback"):
        if label == "gpufleet rollback":  # back to the revision verify recorded before the change
            report = rollback(changed, load=streams, load_interval=interval)
        else:
            report = deploy(
                changed,
                stages=["serve", "verify"],  # verify records the revision the rollback goes back from
                load=streams,
                load_interval=interval,
                bundle=bundle if bundle.is_dir() else None,
            )
        seen = report.availability
        runs.append(
            {
                "change": label,
                "ok": report.ok,
                "seconds": report.seconds,
                "availability": seen.model_dump() if seen is not None else None,
                # why a run failed, in the report's words (the first lines of each failure)
                "failures": [f"{f.host} {f.task}: {f.message[:400]}" for f in report.failures][:4],
                "stages": {stage.name: round(stage.seconds, 1) for stage in report.stages},
            }
        )
    shutil.rmtree(changed, ignore_errors=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return {"date": when, "streams": streams, "interval": interval, "runs": runs}


def rolling_markdown(results: dict[str, Any]) -> str:
    rows = "".join(
        f"| {run['change']} | {run['seconds']:.0f} s | {a['requests']} / {a['failed']} |"
        f" {a['longest_gap']} s |"
        f" {a['p50_before_ms']}/{a['p99_before_ms']} ms | {a['p50_during_ms']}/{a['p99_during_ms']} ms |\n"
        for run in results["runs"]
        if (a := run["availability"]) is not None
    )
    return (
        "\n## A rolling upgrade of tiny's 3 replicas under load (lab, CPU, tiny model)\n\n"
        f"{results['date']}, `benchmarks/availability.py --rolling` on the `make demo` lab: deploy() of the"
        f" serve stage with its load ({results['streams']} streams of 4-token chats to both services through"
        f" the edge, each at most one request per {results.get('interval', 0.5)} s), an upgrade of tiny to a"
        " second image tag with a change of its `max_num_seqs` (serve and verify), then `gpufleet rollback`"
        " of it (rollback()).\n\n"
        "| change | deploy | requests / failed | longest gap | p50/p99 before | p50/p99 during |\n"
        "| --- | --- | --- | --- | --- | --- |\n"
        + rows
        + "\nRaw:\n\n```json\n"
        + json.dumps(results, indent=1)
        + "\n```\n"
    )


def markdown(results: dict[str, Any]) -> str:
    failed = results["failures_s_after_kill_and_status"]
    return (
        "# A replica killed under load, behind the gateway (lab, CPU, tiny model)\n\n"
        f"{results['date']}, `benchmarks/availability.py` on the `make demo` lab: {results['streams']}"
        " streams of 4-token chats to `tiny` (3 replicas, one per host) through the edge for"
        f" {results['seconds']} s;"
        f" at {results['killed_at']} s SIGKILL to {results['victim']['id']}'s `vllm serve` on"
        f" {results['victim']['node']}.\n\n"
        "| figure | measured |\n| --- | --- |\n"
        f"| requests sent / failed | {results['requests']} / {results['failed']} |\n"
        f"| failures (s after the kill, HTTP status; 0 = no answer) | {failed or 'none'} |\n"
        f"| longest gap between two answers | {results['longest_gap_s']} s |\n"
        f"| latency before the kill | {results['latency_before_kill']} |\n"
        f"| latency after the kill | {results['latency_after_kill']} |\n"
        f"| {results['victim']['id']} answering /metrics again | {results.get('answering_after_s')} s after"
        " the kill |\n"
        f"| {results['victim']['id']} served a routed request again | {results.get('served_again_after_s')}"
        " s after the kill |\n"
        f"| requests each replica served | {results['served_per_replica']} |\n\n"
        "Raw:\n\n```json\n" + json.dumps(results, indent=1) + "\n```\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="demo")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--kill-at", type=float, default=10)
    parser.add_argument("--edge-port", type=int, default=8000)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--rolling", action="store_true", help="a rolling change, there and back, measured")
    parser.add_argument("--interval", type=float, default=0.5, help="--rolling: pace of a stream (s)")
    parser.add_argument(
        "--lost-host", action="store_true", help="power the victim's node off instead of killing its vLLM"
    )
    args = parser.parse_args(argv)
    streams, seconds = min(max(args.streams, 1), 16), min(max(args.seconds, 10), 600)
    if args.rolling:
        # --streams 0: the same change without a load, to see what the load itself costs
        measured = rolling(args.name, min(max(args.streams, 0), 16), min(max(args.interval, 0.1), 60.0))
        print(json.dumps(measured, indent=1))
        if args.markdown:
            with args.markdown.open("a", encoding="utf-8") as handle:
                handle.write(rolling_markdown(measured))
        return 0 if all(run["ok"] for run in measured["runs"]) else 1
    results = run(
        args.name, streams, seconds, min(args.kill_at, seconds / 2), args.edge_port, lost_host=args.lost_host
    )
    print(json.dumps(results, indent=1))
    if args.markdown and not args.lost_host:
        args.markdown.write_text(markdown(results), encoding="utf-8")
    restored = results.get("next_deploy", {}).get("ok", True)  # --lost-host: the deploy after the boot
    return 0 if results.get("kill_rc") == 0 and restored else 1


if __name__ == "__main__":
    sys.exit(main())
