#!/usr/bin/env python3
"""Lab stress (issue 18): many `lab up`/`down` cycles and `lab reset`s, two labs side by side, 0 failures.

Run as root on a lab-capable machine (`make lab-stress`); not part of `make test`. Two worker processes
each own one lab of ``--nodes`` hosts and run the same phase at the same time, so their cgroup, network and
state operations interleave as two pytest runs or a test and a demo would:

- ``cycles``: ``--cycles`` times `up` (boot to SSH) then `down` (nothing left);
- ``resets``: `up` once, then ``--resets`` times `reset` (fresh hosts, SSH ready), then `down`.

Every failure is reported with its cycle number and the first line of its error; the results table goes
to stdout and, with ``--markdown FILE``, to a file (with machine, load and date).

    .venv/bin/python benchmarks/lab_stress.py [--cycles 50] [--resets 50] [--nodes 3] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.lab import Lab

LABS = ("stress-a", "stress-b")


def worker(phase: str, name: str, count: int, nodes: int) -> list[dict[str, object]]:
    """One lab's side of a phase: a record (cycle, ok, seconds, error) per up/down cycle or reset."""
    lab = Lab(name, nodes=nodes)
    records: list[dict[str, object]] = []

    def attempt(cycle: int, action: object) -> None:
        started = time.monotonic()
        try:
            action()  # type: ignore[operator]
            records.append({"cycle": cycle, "ok": True, "seconds": time.monotonic() - started})
        except Exception as error:  # a stress run counts every failure and goes on
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            records.append(
                {"cycle": cycle, "ok": False, "seconds": time.monotonic() - started, "error": first}
            )

    try:
        if phase == "cycles":
            for cycle in range(1, count + 1):
                attempt(cycle, lambda: (lab.up(), lab.down()))
        else:
            lab.up()
            for cycle in range(1, count + 1):
                attempt(cycle, lab.reset)
    finally:
        lab.down()
    return records


def run_phase(phase: str, count: int, nodes: int) -> dict[str, list[dict[str, object]]]:
    """Both labs at once, each in its own process; their records by lab name."""
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                phase,
                "--name",
                name,
                "--count",
                str(count),
                "--nodes",
                str(nodes),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in LABS
    }
    results = {}
    for name, proc in procs.items():
        out, _ = proc.communicate()
        if proc.returncode != 0:
            results[name] = [
                {"cycle": 0, "ok": False, "seconds": 0.0, "error": f"worker exited {proc.returncode}"}
            ]
        else:
            results[name] = json.loads(out.strip().splitlines()[-1])
    return results


def table(phase: str, results: dict[str, list[dict[str, object]]]) -> list[str]:
    lines = []
    for name, records in results.items():
        seconds = [float(r["seconds"]) for r in records if r["ok"]]  # type: ignore[arg-type]
        failed = [r for r in records if not r["ok"]]
        median = f"{statistics.median(seconds):.1f}" if seconds else "-"
        worst = f"{max(seconds):.1f}" if seconds else "-"
        lines.append(f"| {phase} | {name} | {len(records)} | {len(failed)} | {median} | {worst} |")
        lines += [f"|  | failed cycle {r['cycle']} |  |  |  | {r.get('error', '')} |" for r in failed]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--resets", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--worker", choices=("cycles", "resets"), help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.name, args.count, args.nodes)))
        return 0

    started = time.monotonic()
    load_before = os.getloadavg()
    rows = ["| phase | lab | cycles | failures | median s | worst s |", "|---|---|---|---|---|---|"]
    failures = 0
    for phase, count in (("cycles", args.cycles), ("resets", args.resets)):
        results = run_phase(phase, count, args.nodes)
        failures += sum(not r["ok"] for records in results.values() for r in records)
        rows += table(phase, results)
        print("\n".join(rows[-len(results) :]), flush=True)
    header = [
        f"# Lab stress: {args.cycles} up/down cycles and {args.resets} resets of {args.nodes} hosts, "
        f"two labs side by side",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {platform.node()}, {os.cpu_count()} cores, "
        f"kernel {platform.release()}; load average before {load_before[0]:.1f}, after "
        f"{os.getloadavg()[0]:.1f}; {time.monotonic() - started:.0f} s in all; {failures} failures.",
        "",
    ]
    report = "\n".join([*header, *rows]) + "\n"
    print(report)
    if args.markdown:
        args.markdown.write_text(report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
