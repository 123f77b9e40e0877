"""How fast ``gpufleet plan`` answers (issue 12: under 0.3 s; validate and preflight call it).

Times, for each planner model of tests/unit/data/planner_models on an H100 (79.18 GiB): the whole
``gpufleet plan --json`` command as a user runs it (a fresh Python process: imports included), and
``plan()`` alone, in-process, including a refused plan that searches for proposals; then
``gpufleet plan -i inventories/prod`` (what validate and preflight run: the inventory read through
ansible-core, the roles' argument specs, the fleet schema, the placement and the planner once per replica:
prod is services since issue 35, results/planner.md's earlier figures are of one instance), wall and CPU
seconds, with the load average beside them (the box is shared: wall time follows the load, CPU time much
less).
Writes Markdown to stdout.
Usage: .venv/bin/python benchmarks/planner.py [REPEATS]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.planner import GpuDevice, PlanRequest, load_model_config, plan

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "unit" / "data" / "planner_models"
GPU = GpuDevice(name="NVIDIA H100 80GB HBM3", memory_gib=79.18)
CLI = [sys.executable, "-m", "gpufleet.cli"]


def cli_seconds(model: Path, extra: list[str], repeats: int) -> float:
    cmd = [*CLI, "plan", "--model", str(model), "--gpu-memory-gib", "79.18", "--tensor-parallel-size", "1"]
    cmd += ["--gpu-memory-utilization", "0.9", "--max-model-len", "8192", "--json", *extra]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def inventory_seconds(repeats: int) -> tuple[float, float]:
    """Median wall and CPU (user + system of the child) seconds of ``gpufleet plan -i inventories/prod``."""
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        cmd = [*CLI, "plan", "-i", str(ROOT / "inventories" / "prod")]
        subprocess.run(cmd, capture_output=True, check=False)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def plan_seconds(request: PlanRequest, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan(request)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print("| model | `gpufleet plan --json` s (median) | `plan()` ms | refused `plan()` with proposals ms |")
    print("| --- | ---: | ---: | ---: |")
    for model in sorted(MODELS.iterdir()):
        config = load_model_config(model)
        request = PlanRequest(hf_config=config, gpus=(GPU,), max_model_len=8192)
        refused = request.model_copy(update={"gpu_memory_utilization": 0.2, "max_model_len": 32768})
        cli = cli_seconds(model, [], repeats)
        print(
            f"| {model.name} | {cli:.3f} | {plan_seconds(request, repeats * 10) * 1000:.2f} "
            f"| {plan_seconds(refused, repeats * 10) * 1000:.2f} |"
        )
    load = os.getloadavg()[0]
    wall, cpu = inventory_seconds(repeats)
    print(f"\n`gpufleet plan -i inventories/prod`: {wall:.3f} s wall, {cpu:.3f} s CPU (median), ", end="")
    print(f"load average {load:.1f}")


if __name__ == "__main__":
    main()
