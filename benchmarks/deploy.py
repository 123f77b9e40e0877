"""Deploy timings on the lab: bundle build, cold deploy per stage from a built bundle, the no-op re-run, and
where the time goes (CPU of Ansible on this machine, CPU inside the lab hosts, waiting).

    sudo .venv/bin/python benchmarks/deploy.py [--name bench-deploy] [--nodes 3 12] [--noop-runs 2]
        [--json results.json] [--markdown results.md] [--skip-bundle] [--artifacts-batch N] [--together]

For each ``--nodes`` count in turn, on its own offline lab of that many hosts (torn down at the end, even on
failure, before the next count starts): deploys every stage from ``dist/lab-bundle`` (built first by
``gpufleet.lab.demo.build_lab_bundle`` if needed), then deploys again ``--noop-runs`` times (the no-op
re-run: nothing to change).

With ``--together``, every lab stays up: each gets its cold deploy in turn (the first on a machine with no
other lab), then the no-op re-runs alternate between the labs, round by round, so that this machine's drift
over a sitting (measured: a 3-host no-op took 10.3 s in one sitting and 7.7 s in the next, on the same code)
falls on every lab alike instead of on whichever ran later; every lab sits idle beside the others' re-runs. A
lab whose cold deploy ran its artifacts stage in batches gets one full deploy first, which records the fleet
stamp the batched stages leave out ("stamp"). Both labs at once need the disk for both: 3 and 12 hosts, with
``--artifacts-batch 3``, peak at about 60 GB (each host holds 3.4 GB once loaded, 2.9 GB more while loading).
The CPU the other labs' idle hosts use meanwhile counts on neither side of a stage's figures. The summary
gives each lab's mean no-op re-run (those with changed=0) and its ratio to the smallest lab's.

The bundle build is timed into a fresh directory (the serving image and the Debian downloads come from
their caches, as on any machine that built them once) and again with nothing to do; that directory is
removed afterwards. Every figure is printed with the load average, since this machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
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
from gpufleet.runner.arguments import strategy_env
from gpufleet.runner.report import Failure, StageResult


def machine_cpu() -> float:
    """CPU seconds this machine has been busy so far, every process (user, nice, system, irq, softirq).

    The control node's share of a stage is this less the lab hosts' (hosts_cpu): the stages of a deploy run
    in one ansible-playbook process, so its own usage (RUSAGE_CHILDREN) is known only after the last one."""
    busy = Path("/proc/stat").read_text().splitlines()[0].split()[1:8]
    user, nice, system, _idle, _iowait, irq, softirq = (int(value) for value in busy)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


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

    def __init__(self, lab: Lab, others: tuple[Lab, ...] = ()) -> None:
        self.lab = lab
        self.others = others  # labs up beside it (--together): their hosts' CPU is neither side's
        self.rows: list[dict[str, Any]] = []
        self._start: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def _others_cpu(self) -> float:
        return sum(hosts_cpu(other) for other in self.others)

    def stage_started(self, stage: str) -> None:
        self._start = (time.monotonic(), machine_cpu(), hosts_cpu(self.lab), self._others_cpu())

    def stage_finished(self, result: StageResult) -> None:
        wall, machine, hosts, others = self._start
        spent_hosts = hosts_cpu(self.lab) - hosts
        spent_others = self._others_cpu() - others
        self.rows.append(
            {
                "stage": result.name,
                "status": "in sync (skipped)" if result.in_sync else result.status,
                "wall_s": round(time.monotonic() - wall, 1),
                "control_cpu_s": round(machine_cpu() - machine - spent_hosts - spent_others, 1),
                "hosts_cpu_s": round(spent_hosts, 1),
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


def cold_in_batches(
    inventory: Path, bundle: Path, clock: StageClock, hosts: list[str], batch: int
) -> dict[str, Any]:
    """The cold deploy with the artifacts stage run ``batch`` hosts at a time (``--limit``): on a lab whose
    hosts share one disk, every host holding its image archive and the loaded layers at once can fill it."""
    parts: list[tuple[tuple[str, ...], str | None]] = [(("preflight", "nodes"), None)]
    parts += [
        (("artifacts",), ",".join(hosts[index : index + batch])) for index in range(0, len(hosts), batch)
    ]
    parts.append((("cluster", "serve", "verify"), None))
    ok, seconds, changed = True, 0.0, 0
    for stages, limit in parts:
        report = deploy(inventory, bundle=bundle, stages=stages, limit=limit, progress=clock)
        if limit is not None:
            clock.rows[-1]["stage"] = f"artifacts ({limit})"
        ok, seconds, changed = report.ok, seconds + report.seconds, changed + report.changed
        if not ok:
            break
    return {"ok": ok, "seconds": round(seconds, 3), "changed": changed, "artifacts_batch": batch}


def settle_disk(limit_s: float = 180.0) -> dict[str, float]:
    """Write back what earlier work left dirty and wait out ext4's window for recently deleted inodes.

    This machine's ext4 has no journal: there, for up to 60 s after a deletion, ext4 skips the freed inodes
    one by one when it allocates (``recently_deleted``), and a lab torn down just before (hundreds of
    thousands of files) made the next ``docker load`` up to twice as slow; a previous lab's dirty pages still
    being written back compete with it too. So each cold deploy starts from a disk at rest: sync, dirty and
    writeback data below 64 MB, and 60 s since the sync began. Reported with the results."""
    start = time.monotonic()
    os.sync()
    while time.monotonic() - start < limit_s:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        pending = sum(int(meminfo[key].split()[0]) for key in ("Dirty", "Writeback")) * 1024
        if pending < 64 << 20 and time.monotonic() - start >= 60:
            break
        time.sleep(2)
    return {"settle_s": round(time.monotonic() - start, 1)}


def run_deploys(name: str, bundle: Path, nodes: int, noop_runs: int, batch: int | None) -> dict[str, Any]:
    """A cold deploy on ``nodes`` fresh offline hosts, then ``noop_runs`` re-runs; the lab goes down after."""
    lab = Lab(name, nodes=nodes, offline=True)
    try:
        settled = settle_disk()
        start = time.monotonic()
        inventory = lab.up()
        up = time.monotonic() - start
        route_to_bridge(lab, inventory)
        drops = outbound_drops(name)
        results: dict[str, Any] = {"nodes": nodes, "lab_up_s": round(up, 1)} | settled
        for run in ("cold", *(f"noop{index}" for index in range(1, noop_runs + 1))):
            clock = StageClock(lab)
            if run == "cold" and batch:
                outcome = cold_in_batches(inventory.inventory, bundle, clock, list(inventory.ips), batch)
            else:
                report = deploy(inventory.inventory, bundle=bundle, progress=clock)
                outcome = {"ok": report.ok, "seconds": report.seconds, "changed": report.changed}
            results[run] = outcome | {"stages": clock.rows, "load_1min": round(os.getloadavg()[0], 1)}
            print(
                f"{nodes} hosts, {run}: {outcome['seconds']:.1f} s, changed={outcome['changed']}",
                file=sys.stderr,
            )
            if not outcome["ok"]:
                break
        results["outbound_packets"] = outbound_drops(name) - drops
        return results
    finally:
        lab.down()


def deploy_once(
    lab: Lab,
    inventory: Path,
    bundle: Path,
    run: str,
    *,
    batch: int | None = None,
    hosts: list[str] | None = None,
    others: tuple[Lab, ...] = (),
) -> dict[str, Any]:
    """One timed deploy of every stage (a cold one with its artifacts stage ``batch`` ``hosts`` at a time)."""
    clock = StageClock(lab, others)
    if run == "cold" and batch and hosts:
        outcome = cold_in_batches(inventory, bundle, clock, hosts, batch)
    else:
        report = deploy(inventory, bundle=bundle, progress=clock)
        outcome = {"ok": report.ok, "seconds": report.seconds, "changed": report.changed}
    print(f"{lab.name}, {run}: {outcome['seconds']:.1f} s, changed={outcome['changed']}", file=sys.stderr)
    return outcome | {"stages": clock.rows, "load_1min": round(os.getloadavg()[0], 1)}


def run_together(
    name: str, bundle: Path, counts: list[int], noop_runs: int, batch: int | None
) -> list[dict[str, Any]]:
    """Every lab up at once: their cold deploys in turn, then their no-op re-runs alternating by rounds."""
    labs: list[tuple[Lab, dict[str, Any]]] = []
    inventories: list[Path] = []
    try:
        for nodes in counts:
            lab = Lab(f"{name}-{nodes}", nodes=nodes, offline=True)
            results: dict[str, Any] = {"nodes": nodes}
            labs.append((lab, results))  # down at the end, even when it fails to come up
            results |= settle_disk()
            start = time.monotonic()
            inventory = lab.up()
            results["lab_up_s"] = round(time.monotonic() - start, 1)
            route_to_bridge(lab, inventory)
            results["_drops"] = outbound_drops(lab.name)
            inventories.append(inventory.inventory)
            lab_batch = batch if batch and nodes > batch else None
            others = tuple(other for other, _results in labs[:-1])
            results["cold"] = deploy_once(
                lab,
                inventory.inventory,
                bundle,
                "cold",
                batch=lab_batch,
                hosts=list(inventory.ips),
                others=others,
            )
            if results["cold"]["ok"] and lab_batch:
                results["stamp"] = deploy_once(lab, inventory.inventory, bundle, "stamp", others=others)
            if not all(results[run]["ok"] for run in runs(results)):
                return [results for _lab, results in labs]
        for index in range(1, noop_runs + 1):
            for (lab, results), inventory_path in zip(labs, inventories, strict=True):
                others = tuple(other for other, _results in labs if other is not lab)
                results[f"noop{index}"] = deploy_once(
                    lab, inventory_path, bundle, f"noop{index}", others=others
                )
                if not results[f"noop{index}"]["ok"]:
                    return [results for _lab, results in labs]
        return [results for _lab, results in labs]
    finally:
        for lab, results in reversed(labs):
            if "_drops" in results:
                results["outbound_packets"] = outbound_drops(lab.name) - results.pop("_drops")
            lab.down()


def noop_summary(labs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each lab's mean no-op re-run (the runs with changed=0, all ok) and its ratio to the smallest lab's."""
    rows = []
    for lab in labs:
        seconds = [
            lab[run]["seconds"]
            for run in runs(lab)
            if run.startswith("noop") and lab[run]["ok"] and lab[run]["changed"] == 0
        ]
        if seconds:
            rows.append({"nodes": lab["nodes"], "runs": len(seconds), "mean_s": sum(seconds) / len(seconds)})
    if rows:
        base = min(rows, key=lambda row: row["nodes"])["mean_s"]
        for row in rows:
            row["mean_s"] = round(row["mean_s"], 2)
            row["ratio"] = round(row["mean_s"] / base, 2)
    return rows


def runs(lab: dict[str, Any]) -> list[str]:
    """The deploys a lab's results hold, in the order they ran: cold, stamp (if any), noop1, noop2, ..."""
    return [run for run in lab if run in ("cold", "stamp") or run.startswith("noop")]


def markdown(results: dict[str, Any]) -> str:
    """The results as the tables of benchmarks/results/deploy.md."""
    lines = [
        "# Deploy benchmarks",
        "",
        f"{results['date']}. Machine: {results['cpus']} CPUs; load average at start "
        f"{results['load_at_start']}, at end {results['load_at_end']}. Offline lab hosts (`gpufleet lab`, "
        "systemd-nspawn) on this machine, "
        f"every stage from `dist/lab-bundle`, Ansible strategy {results['strategy']}. Script: "
        f"`{results['command']}` (root). Control-node CPU: the machine's busy CPU less the lab hosts' (the "
        "stages run in one ansible-playbook process).",
        "",
        "| step | seconds |",
        "| --- | --- |",
    ]
    for key, label in (
        ("bundle_build_s", "bundle build into an empty directory (image and .debs from their caches)"),
        ("bundle_rebuild_noop_s", "bundle build again (nothing to do)"),
    ):
        if key in results:
            lines.append(f"| {label} | {results[key]} |")
    for lab in results["labs"]:
        nodes = lab["nodes"]
        if "settle_s" in lab:
            label = f"disk at rest before the {nodes}-host lab (sync, settle_disk)"
            lines.append(f"| {label} | {lab['settle_s']} |")
        lines.append(f"| {nodes} offline lab hosts up | {lab['lab_up_s']} |")
    for lab in results["labs"]:
        nodes = lab["nodes"]
        for run in runs(lab):
            outcome = lab[run]
            label = {
                "cold": "cold deploy (bare hosts)",
                "stamp": "full deploy after the batched cold one (records the fleet stamp)",
            }.get(run, f"no-op re-run {run[4:]}")
            if outcome.get("artifacts_batch"):
                label += (
                    f", the artifacts stage {outcome['artifacts_batch']} hosts at a time (the lab's disk)"
                )
            lines += [
                "",
                f"## {nodes} hosts, {label}: {outcome['seconds']:.0f} s, changed={outcome['changed']}, "
                f"{'ok' if outcome['ok'] else 'FAILED'}",
                "",
                "| stage | status | wall s | control-node CPU s | hosts' CPU s | changed | tasks/host "
                "| load (1 min) |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for row in outcome["stages"]:
                lines.append(
                    f"| {row['stage']} | {row['status']} | {row['wall_s']} | {row['control_cpu_s']} | "
                    f"{row['hosts_cpu_s']} | {row['changed']} | {row['tasks_per_host']} | "
                    f"{row['load_1min']} |"
                )
        packets = lab.get("outbound_packets", "n/a")
        lines += ["", f"Packets the {nodes} offline hosts sent beyond the lab: {packets}."]
    if results.get("noop_summary"):
        lines += [
            "",
            "## No-op re-runs (changed=0), mean per lab"
            + (", alternating between the labs round by round" if results.get("together") else ""),
            "",
            "| hosts | re-runs | mean s | ratio to the smallest lab |",
            "| --- | --- | --- | --- |",
        ]
        for row in results["noop_summary"]:
            lines.append(f"| {row['nodes']} | {row['runs']} | {row['mean_s']} | {row['ratio']} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="bench-deploy", help="lab name (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--markdown", type=Path, help="also write the results as a Markdown report here")
    parser.add_argument("--skip-bundle", action="store_true", help="do not time the bundle build")
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[3], help="lab sizes, one lab each in turn (default: 3)"
    )
    parser.add_argument(
        "--artifacts-batch",
        type=int,
        help="labs over this many hosts run the cold artifacts stage this many hosts at a time (one disk)",
    )
    parser.add_argument(
        "--noop-runs", type=int, default=2, help="re-runs after each cold deploy (default: 2)"
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="keep every lab up and alternate their no-op re-runs (the disk must hold every lab at once)",
    )
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    bundle = build_lab_bundle(DIST / "lab-bundle", DIST / "lab-demo", console)
    results: dict[str, Any] = {
        "command": " ".join(["benchmarks/deploy.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "strategy": strategy_env(os.environ)["ANSIBLE_STRATEGY"],
        "cpus": os.cpu_count(),
        "load_at_start": [round(x, 1) for x in os.getloadavg()],
    }
    if not args.skip_bundle:
        results |= time_bundle(console)
    if args.together:
        results["together"] = True
        results["labs"] = run_together(args.name, bundle, args.nodes, args.noop_runs, args.artifacts_batch)
    else:
        results["labs"] = [
            run_deploys(
                args.name,
                bundle,
                nodes,
                args.noop_runs,
                args.artifacts_batch if args.artifacts_batch and nodes > args.artifacts_batch else None,
            )
            for nodes in args.nodes
        ]
    results["noop_summary"] = noop_summary(results["labs"])
    results["load_at_end"] = [round(x, 1) for x in os.getloadavg()]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(markdown(results), encoding="utf-8")
    # A lab stops at its first failed deploy: ok when every lab ran every deploy asked for, all ok.
    done = len(results["labs"]) == len(args.nodes) and all(
        len([run for run in runs(lab) if run != "stamp"]) == 1 + args.noop_runs
        and all(lab[run]["ok"] for run in runs(lab))
        for lab in results["labs"]
    )
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
