"""Deploy timings on the lab: bundle build, cold deploy per stage from a built bundle, the no-op re-run, and
where the time goes (CPU of Ansible on this machine, CPU inside the lab hosts, waiting).

    sudo .venv/bin/python benchmarks/deploy.py [--name bench-deploy] [--json results.json] [--skip-bundle]

Runs on its own offline lab of three hosts (torn down at the end, even on failure), deploys every stage
from ``dist/lab-bundle`` (built first by ``gpufleet.lab.demo.build_lab_bundle`` if needed), then deploys
again.
The bundle build is timed into a fresh directory (the serving image and the Debian downloads come from
their caches, as on any machine that built them once) and again with nothing to do; that directory is
removed afterwards. Every figure is printed with the load average, since this machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from gpufleet.lab import Lab
from gpufleet.lab.demo import DIST, build_lab_bundle, route_to_bridge
from gpufleet.lab.net import outbound_drops
from gpufleet.runner import deploy
from gpufleet.runner.report import Failure, StageResult


def children_cpu() -> float:
    """CPU seconds of finished child processes (ansible-playbook and its workers, ssh)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def hosts_cpu(lab: Lab) -> float:
    """CPU seconds used inside the lab's hosts so far (cgroup v1 cpuacct, or cgroup2 cpu.stat)."""
    total = 0.0
    for host in lab.state().hosts:
        for directory in host.spec().cgroups:
            acct, stat = Path(directory, "cpuacct.usage"), Path(directory, "cpu.stat")
            if acct.is_file():
                total += int(acct.read_text()) / 1e9
                break
            if stat.is_file() and "usage_usec" in (text := stat.read_text()):
                total += int(text.split("usage_usec")[1].split()[0]) / 1e6
                break
    return total


class StageClock:
    """A ProgressSink recording, per stage, wall time, this machine's and the hosts' CPU, and the load."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.rows: list[dict[str, Any]] = []
        self._start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def stage_started(self, stage: str) -> None:
        self._start = (time.monotonic(), children_cpu(), hosts_cpu(self.lab))

    def stage_finished(self, result: StageResult) -> None:
        wall, control, hosts = self._start
        self.rows.append(
            {
                "stage": result.name,
                "status": result.status,
                "wall_s": round(time.monotonic() - wall, 1),
                "control_cpu_s": round(children_cpu() - control, 1),
                "hosts_cpu_s": round(hosts_cpu(self.lab) - hosts, 1),
                "changed": sum(host.changed for host in result.hosts),
                "tasks_per_host": max(
                    (host.ok + host.skipped + host.failed for host in result.hosts), default=0
                ),
                "load_1min": round(os.getloadavg()[0], 1),
            }
        )

    def task_started(self, stage: str, host: str, task: str) -> None: ...
    def task_done(self, stage: str, host: str, outcome: str) -> None: ...
    def failed(self, failure: Failure) -> None:
        print(f"FAILED {failure.stage} {failure.host} {failure.task}: {failure.message}", file=sys.stderr)


def time_bundle(console: Console) -> dict[str, float]:
    scratch = DIST / "bench-bundle"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        start = time.monotonic()
        build_lab_bundle(scratch, DIST / "lab-demo", console)
        cold = time.monotonic() - start
        start = time.monotonic()
        build_lab_bundle(scratch, DIST / "lab-demo", console)
        return {"bundle_build_s": round(cold, 1), "bundle_rebuild_noop_s": round(time.monotonic() - start, 1)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_deploys(name: str, bundle: Path) -> dict[str, Any]:
    lab = Lab(name, nodes=3, offline=True)
    try:
        start = time.monotonic()
        inventory = lab.up()
        up = time.monotonic() - start
        route_to_bridge(lab, inventory)
        drops = outbound_drops(name)
        results: dict[str, Any] = {"lab_up_s": round(up, 1)}
        for run in ("cold", "noop"):
            clock = StageClock(lab)
            report = deploy(inventory.inventory, bundle=bundle, progress=clock)
            results[run] = {"ok": report.ok, "seconds": report.seconds, "changed": report.changed,
                            "stages": clock.rows}  # fmt: skip
            if not report.ok:
                break
        results["outbound_packets"] = outbound_drops(name) - drops
        return results
    finally:
        lab.down()


def markdown(results: dict[str, Any]) -> str:
    """The results as the tables of benchmarks/results/deploy.md."""
    lines = [
        "# Deploy benchmarks",
        "",
        f"Machine: {results['cpus']} CPUs; load average at start {results['load_at_start']}, at end "
        f"{results['load_at_end']}. Three offline lab hosts (`gpufleet lab`, systemd-nspawn), every stage "
        "from `dist/lab-bundle`. Script: "
        "`benchmarks/deploy.py --markdown benchmarks/results/deploy.md` (root).",
        "",
        "| step | seconds |",
        "| --- | --- |",
    ]
    for key, label in (
        ("bundle_build_s", "bundle build into an empty directory (image and .debs from their caches)"),
        ("bundle_rebuild_noop_s", "bundle build again (nothing to do)"),
        ("lab_up_s", "three offline lab hosts up"),
    ):
        if key in results:
            lines.append(f"| {label} | {results[key]} |")
    for run, label in (("cold", "cold deploy (bare hosts)"), ("noop", "re-run on the deployed hosts")):
        if run not in results:
            continue
        outcome = results[run]
        lines += [
            "",
            f"## {label}: {outcome['seconds']:.0f} s, changed={outcome['changed']}, "
            f"{'ok' if outcome['ok'] else 'FAILED'}",
            "",
            "| stage | status | wall s | control-node CPU s | hosts' CPU s | changed | tasks/host "
            "| load (1 min) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in outcome["stages"]:
            lines.append(
                f"| {row['stage']} | {row['status']} | {row['wall_s']} | {row['control_cpu_s']} | "
                f"{row['hosts_cpu_s']} | {row['changed']} | {row['tasks_per_host']} | {row['load_1min']} |"
            )
    packets = results.get("outbound_packets", "n/a")
    lines += ["", f"Packets the offline hosts sent beyond the lab: {packets}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="bench-deploy", help="lab name (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--markdown", type=Path, help="also write the results as a Markdown report here")
    parser.add_argument("--skip-bundle", action="store_true", help="do not time the bundle build")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    bundle = build_lab_bundle(DIST / "lab-bundle", DIST / "lab-demo", console)
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_at_start": [round(x, 1) for x in os.getloadavg()],
    }
    if not args.skip_bundle:
        results |= time_bundle(console)
    results |= run_deploys(args.name, bundle)
    results["load_at_end"] = [round(x, 1) for x in os.getloadavg()]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(markdown(results), encoding="utf-8")
    return 0 if results.get("noop", {}).get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
