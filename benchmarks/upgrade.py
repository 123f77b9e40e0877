"""Downtime of changes on a deployed lab: an upgrade to another image, an upgrade to an image that exits at
start (failed gate, automatic rollback), and ``gpufleet rollback`` there and back.

    make demo      # a deployed lab named demo, left up
    sudo .venv/bin/python benchmarks/upgrade.py [--name demo] [--markdown benchmarks/results/upgrade.md]

The images are made on the lab's head from its serving image (gpufleet.lab.upgrade). Every change is
``deploy()`` or ``rollback()`` with the downtime they measure themselves (the endpoint polled from this
machine every second); the lab ends running the image it began with. Figures carry the load average: the
machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.lab import Lab
from gpufleet.lab.state import lab_dir
from gpufleet.lab.upgrade import BROKEN_SUFFIX, UPGRADE_SUFFIX, make_images
from gpufleet.runner import DeployReport, deploy, rollback

BASE = "gpufleet/vllm-cpu:0.32.0"
STAGES = ["cluster", "serve", "verify"]


def figures(what: str, report: DeployReport) -> dict[str, Any]:
    downtime = report.downtime
    back = report.rollback
    return {
        "change": what,
        "ok": report.ok,
        "failed_stage": report.failed_stage,
        "seconds": round(report.seconds, 1),
        "downtime_s": downtime.seconds if downtime else None,
        "answers_after": downtime.answers_after if downtime else None,
        "rolled_back": bool(back and back.ok),
        "stages": {stage.name: round(stage.seconds, 1) for stage in report.stages},
        "load_1min": round(os.getloadavg()[0], 1),
    }


def run(name: str) -> dict[str, Any]:
    lab = Lab(name)
    inventory = lab_dir(name) / "inventory" / "hosts.yml"
    started = time.time()
    made = time.monotonic()
    ids = make_images(lab, BASE)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "cpus": os.cpu_count(),
        "load_at_start": round(os.getloadavg()[0], 1),
        "images_seconds": round(time.monotonic() - made, 1),
        "images": ids,
        "changes": [],
    }
    changes = results["changes"]
    upgrade = {"ray_cluster_image": BASE + UPGRADE_SUFFIX}
    changes.append(figures("upgrade to another image", deploy(inventory, stages=STAGES, extra_vars=upgrade)))
    broken = {"ray_cluster_image": BASE + BROKEN_SUFFIX}
    failed = deploy(inventory, stages=STAGES, extra_vars=broken)
    changes.append(figures("upgrade to an image that exits at start", failed))
    changes.append(figures("gpufleet rollback (to the first image)", rollback(inventory)))
    changes.append(figures("gpufleet rollback (forward again)", rollback(inventory)))
    changes.append(figures("gpufleet rollback (back to the first image)", rollback(inventory)))
    results["load_at_end"] = round(os.getloadavg()[0], 1)
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Downtime of changes (benchmarks/upgrade.py)",
        "",
        f"{results['date']}. Machine: {results['cpus']} CPUs; load average at start "
        f"{results['load_at_start']}, at end {results['load_at_end']}. Three offline lab hosts, the CPU "
        "build of vLLM 0.32 serving the tiny model with the Ray executor; stages cluster, serve and verify. "
        "Downtime: the endpoint (`GET /v1/models` with the key) polled from the control node every second, "
        "from the first failed probe to the next answer. Making the two images on the head and loading "
        f"them on the workers took {results['images_seconds']} s.",
        "",
        "| change | result | run | downtime | answers after | load |",
        "| --- | --- | ---: | ---: | --- | ---: |",
    ]
    for change in results["changes"]:
        result = "ok" if change["ok"] else f"failed in {change['failed_stage']}"
        if change["rolled_back"] and change["failed_stage"] not in (None, "rollback"):
            result += ", rolled back"
        lines.append(
            f"| {change['change']} | {result} | {change['seconds']} s | {change['downtime_s']} s | "
            f"{'yes' if change['answers_after'] else 'NO'} | {change['load_1min']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", default="demo", help="the deployed lab (default: demo, from make demo)")
    parser.add_argument("--markdown", type=Path, help="write the results table here")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args()
    results = run(args.name)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(markdown(results), encoding="utf-8")
    expected = [True, False, True, True, True]
    return 0 if [change["ok"] for change in results["changes"]] == expected else 1


if __name__ == "__main__":
    sys.exit(main())
