"""How long `docker load` of the lab's CPU serving image takes on a lab host, by archive format and feed.

    sudo .venv/bin/python benchmarks/image_load.py [--name bench-load] [--repeat 2] [--markdown results.md]

Issue 15 asks which way of loading is cheapest: a plain `docker save` archive or a compressed one, from a
file or streamed (as the relay's ``--load`` feeds it). On one offline lab host with docker installed by the
nodes stage, from ``dist/lab-bundle``, the archive is placed in the host's file system (outside the timing),
then each variant runs ``--repeat`` times, interleaved, each after ``docker rmi`` of every image and a sync:
wall seconds, and the CPU seconds spent inside the host (dockerd, its untar helper, the docker CLI). The
compressed archive is made once on this machine (gzip -1) before the timings. zstd is not a variant: Debian's
docker 20.10 refuses a zstd archive ("archive/tar: invalid tar header"), and the lab hosts have no zstd to
pipe it through. The lab goes down at the end, even on failure.

    sudo .venv/bin/python benchmarks/image_load.py --archive OLD.tar --archive NEW.tar [--repeat 3]

compares images instead (issue 33: the lab image less numba, llvmlite and opencv): each archive, plain, from a
file, interleaved, the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deploy import hosts_cpu

from gpufleet.lab import Lab
from gpufleet.lab.demo import DIST, route_to_bridge
from gpufleet.runner import deploy

IMAGE = "gpufleet-vllm-cpu_0.32.0.tar"
PLACE = "/var/tmp/gpufleet-bench"
VARIANTS = {
    "plain archive, from a file": f"docker load --input {PLACE}/image.tar",
    "plain archive, streamed on stdin": f"cat {PLACE}/image.tar | docker load",
    "gzip -1 archive, from a file (dockerd decompresses)": f"docker load --input {PLACE}/image.tar.gz",
}


def place_images(lab: Lab, archives: list[Path]) -> tuple[dict[str, str], dict[str, int]]:
    """Each archive in the host's root file system as image-N.tar; a variant per archive, and their sizes."""
    target = lab.state().hosts[0].workdir / "root" / PLACE.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    variants, sizes = {}, {}
    for number, archive in enumerate(archives):
        name = f"image-{number}.tar"
        shutil.copyfile(archive, target / name)
        variants[f"{archive.name}, plain, from a file"] = f"docker load --input {PLACE}/{name}"
        sizes[archive.name] = archive.stat().st_size
    return variants, sizes


def place_archives(lab: Lab, bundle: Path) -> dict[str, int]:
    """The archive and its compressed forms in the host's root file system; their sizes."""
    source = bundle / "images" / IMAGE
    host_root = lab.state().hosts[0].workdir / "root"
    target = host_root / PLACE.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target / "image.tar")
    with (target / "image.tar.gz").open("wb") as out:
        subprocess.run(["gzip", "-1", "-c", str(source)], stdout=out, check=True)
    return {name: (target / name).stat().st_size for name in ("image.tar", "image.tar.gz")}


def time_variant(lab: Lab, command: str) -> dict[str, Any]:
    lab.ssh("node1", "docker rmi --force $(docker images --quiet) >/dev/null 2>&1; sync", timeout=300)
    time.sleep(3)
    cpu, start = hosts_cpu(lab), time.monotonic()
    answer = lab.ssh("node1", f"set -o pipefail; {command}", timeout=900)
    return {
        "ok": answer.returncode == 0,
        "wall_s": round(time.monotonic() - start, 1),
        "host_cpu_s": round(hosts_cpu(lab) - cpu, 1),
        "said": (answer.stdout.strip() or answer.stderr.strip())[-200:],
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# docker load of the CPU serving image, by archive format and feed",
        "",
        f"{results['date']}. Machine: {results['cpus']} CPUs; load average at start "
        f"{results['load_at_start']}, at end {results['load_at_end']}. "
        f"One offline lab host (docker {results['docker']}), "
        f"`{results['command']}`. Sizes: "
        + ", ".join(f"{name} {size / 1e9:.2f} GB" for name, size in results["sizes"].items())
        + ".",
        "",
        "| variant | wall s | CPU s in the host | ok |",
        "| --- | --- | --- | --- |",
    ]
    for name, runs in results["variants"].items():
        walls = ", ".join(str(run["wall_s"]) for run in runs)
        cpus = ", ".join(str(run["host_cpu_s"]) for run in runs)
        ok = "yes" if all(run["ok"] for run in runs) else f"no: {runs[-1]['said']}"
        lines.append(f"| {name} | {walls} | {cpus} | {ok} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="bench-load", help="lab name (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each variant (default: 2)")
    parser.add_argument("--markdown", type=Path, help="also write the results as a Markdown report here")
    parser.add_argument("--archive", type=Path, action="append", help="compare these image archives instead")
    args = parser.parse_args(argv)
    bundle = DIST / "lab-bundle"
    lab = Lab(args.name, nodes=1, offline=True)
    results: dict[str, Any] = {
        "command": " ".join(["benchmarks/image_load.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_at_start": [round(x, 1) for x in os.getloadavg()],
        "variants": {},
    }
    variants = VARIANTS
    try:
        inventory = lab.up()
        route_to_bridge(lab, inventory)
        report = deploy(inventory.inventory, bundle=bundle, stages=["preflight", "nodes"])
        if not report.ok:
            print(report, file=sys.stderr)
            return 1
        results["docker"] = lab.ssh("node1", "docker version --format '{{.Server.Version}}'").stdout.strip()
        if args.archive:
            variants, results["sizes"] = place_images(lab, args.archive)
        else:
            results["sizes"] = place_archives(lab, bundle)
        results["variants"] = {name: [] for name in variants}
        for _ in range(args.repeat):
            for name, command in variants.items():
                results["variants"][name].append(time_variant(lab, command))
                print(name, results["variants"][name][-1], file=sys.stderr, flush=True)
    finally:
        lab.down()
    results["load_at_end"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(results, indent=2))
    if args.markdown:
        args.markdown.write_text(markdown(results), encoding="utf-8")
    return 0 if all(run["ok"] for runs in results["variants"].values() for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
