"""The air-gapped end-to-end deployment on three lab hosts: what ``make demo`` runs.

``python -m gpufleet.lab.demo [--name demo] [--bundle dist/lab-bundle] [--down]``:

1. **The lab bundle** (``dist/lab-bundle``): ``offline_bundle/manifest.lab.yml`` (Docker 20.10 repackaged
   from bookworm's .debs, a busybox image, the tiny model as a git-lfs repository made offline) plus the CPU
   serving image (vLLM's CPU build + Ray, :mod:`gpufleet.lab.serving_image`). That image is built on this
   machine, so its sha256 and image ID are known only here: they go into a derived manifest
   (``dist/lab-demo/manifest.yml``) from which :func:`gpufleet.bundle.build` writes the bundle and its lock.
   Every piece is cached: a second run re-checks and fetches nothing.
2. **The lab**: three offline hosts (``gpufleet lab up --name demo --nodes 3 --offline``), reused while
   they are up. Each host gets a default route to this machine's bridge address, where the lab's DROP
   rules drop and count anything not meant for the lab: after the deploy, that count shows whether any
   host tried to reach beyond it.
3. **Deploy** two services (:data:`gpufleet.lab.inventory.DEMO_SERVICES`: ``tiny`` as 3 replicas, one per
   host, and ``tiny-chat`` on the head), every stage from the bundle (:func:`gpufleet.runner.deploy`: live
   table, then the report with each replica), from an inventory of the lab's hosts written beside the lab's
   (``<lab inventory>/../services``).
4. **The gateway** from this machine, as a client would use it: ``GET /v1/models`` lists both models, a chat
   completion with each through the one endpoint (the edge on the head), with the API key; without the key
   401, an unknown model 404.

The lab stays up at the end (``gpufleet lab down --name demo`` removes it), so that running the demo again
shows a deploy that changes nothing; ``--down`` takes it down instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from gpufleet.lab.core import Lab, LabInventory
from gpufleet.lab.inventory import DEMO_SERVICES, services_inventory
from gpufleet.lab.net import outbound_drops
from gpufleet.lab.system import LabError
from gpufleet.paths import project_root

REPO = project_root() or Path(__file__).resolve().parents[3]
LAB_MANIFEST = REPO / "offline_bundle" / "manifest.lab.yml"
DIST = REPO / "dist"
DEMO_LAB = "demo"
PROMPT = "Say hello to the cluster."


@contextmanager
def step(console: Console, title: str, timings: dict[str, float], key: str) -> Iterator[None]:
    """Print a step's title, time it into ``timings[key]``."""
    console.rule(f"[bold]{title}")
    start = time.monotonic()
    yield
    timings[key] = round(time.monotonic() - start, 1)
    console.print(f"[dim]{title}: {timings[key]:.1f} s")


# ----- the lab bundle -----------------------------------------------------------------------------
def model_remote(manifest: dict[str, Any], work: Path) -> None:
    """The tiny model, published where the lab manifest's model source points (deterministic: same commit)."""
    from gpufleet.bundle.lfs import make_lfs_repo  # noqa: PLC0415  (tokenizers: only when building)
    from gpufleet.lab.tiny_model import write_tiny_model  # noqa: PLC0415

    model = manifest["model"]
    bare = (LAB_MANIFEST.parent / model["source"]["url"]).resolve()
    head = bare / "refs" / "heads" / "master"
    if head.is_file() and head.read_text().strip() == model["revision"]:
        return
    _, commit = make_lfs_repo(write_tiny_model(work / "tiny-qwen2"), bare.parent.parent, model["repo"])
    if commit != model["revision"]:
        raise RuntimeError(
            f"{LAB_MANIFEST}: model.revision: found {model['revision']}; the tiny model now publishes as "
            f"{commit}. Fix: pin model.revision to {commit} (gpufleet.lab.tiny_model changed)"
        )


def write_manifest(work: Path, console: Console) -> Path:
    """The lab manifest plus the serving image built (or found cached) on this machine."""
    from gpufleet.lab.serving_image import DEFAULT_SPEC, ImageSpec, build  # noqa: PLC0415

    manifest = yaml.safe_load(LAB_MANIFEST.read_text(encoding="utf-8"))
    model_remote(manifest, work)
    image = build(ImageSpec.load(DEFAULT_SPEC))
    console.print(f"serving image {image.tag}: {image.size / 2**30:.2f} GiB, {image.image_id[:19]}…")
    name, tag = image.tag.rsplit(":", 1)
    source = {"kind": "docker-archive", "path": str(image.path), "sha256": image.sha256}
    manifest["images"] = [
        *[entry for entry in manifest.get("images", []) if entry["name"] != name],
        {"name": name, "tag": tag, "id": image.image_id, "source": source},
    ]
    manifest["model"]["source"]["url"] = str(
        (LAB_MANIFEST.parent / manifest["model"]["source"]["url"]).resolve()
    )
    path = work / "manifest.yml"
    text = "# Derived by gpufleet.lab.demo from offline_bundle/manifest.lab.yml and this machine's image.\n"
    path.write_text(text + yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
    return path


def build_lab_bundle(out: Path, work: Path, console: Console) -> Path:
    """Build (or complete and re-check) the lab bundle in ``out``; raises RuntimeError on any problem."""
    from gpufleet.bundle import build, verify  # noqa: PLC0415

    work.mkdir(parents=True, exist_ok=True)
    result = build(write_manifest(work, console), out, console=console)
    problems = verify(out)
    if problems:
        raise RuntimeError(f"bundle {out}: " + "; ".join(problems))
    size = sum(entry.size for entry in result.lock.files)
    console.print(
        f"bundle {out}: {len(result.lock.files)} files, {size / 2**30:.2f} GiB; "
        f"fetched {', '.join(result.fetched) or 'nothing'}; "
        f"already present {', '.join(result.reused) or 'nothing'}; verified"
    )
    return out


# ----- the lab ------------------------------------------------------------------------------------
def ensure_lab(name: str, console: Console) -> tuple[Lab, LabInventory]:
    """The running offline lab of that name when all three hosts answer, else three fresh ones."""
    lab = Lab(name, nodes=3, offline=True)
    try:
        inventory = lab.inventory()
        healthy = inventory.offline and len(inventory.hosts) == 3 and all(h.ssh for h in lab.status())
    except Exception:  # no lab, or a broken one: either way a fresh one follows
        healthy = False
    if healthy:
        console.print(f"lab {name}: already up ({', '.join(inventory.ips.values())}), reused")
        return lab, inventory
    inventory = lab.up()
    console.print(f"lab {name}: {len(inventory.hosts)} offline hosts up on {inventory.subnet}")
    return lab, inventory


def route_to_bridge(lab: Lab, inventory: LabInventory) -> None:
    """A default route to the bridge on each host: a try to leave the lab is dropped and counted there."""
    for host in inventory.hosts:
        lab.ssh(host.name, f"ip route replace default via {inventory.bridge_ip}", timeout=30, check=True)


# ----- the plan and the endpoint ------------------------------------------------------------------
def lab_plan(inventory: Path, bundle: Path, service: str | None = None) -> Any:
    """The planner's prediction for a lab inventory (gpufleet.planner.Plan): its one instance, or one replica
    of ``service``.

    The lab has no GPU, so ``gpufleet plan`` plans nothing there. vLLM's CPU build holds its KV cache in
    host memory, sized by ``vllm_service_kv_cache_memory_gib``: planned as one device with this machine's
    memory, the KV-cache memory, tokens and concurrency come out exact, and the weights as computed.
    """
    from gpufleet.fleet import load_fleet  # noqa: PLC0415  (imports ansible)
    from gpufleet.planner import GpuDevice, PlanRequest, load_model_config, plan  # noqa: PLC0415

    fleet = load_fleet(inventory)
    model, serving = fleet.model, fleet.serving
    if service is not None:
        (spec,) = [listed for listed in fleet.services if listed.name == service]
        model, serving = spec.model, spec.serving
    memory = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20  # MemTotal, KiB -> GiB
    request = PlanRequest(
        hf_config=load_model_config(bundle / "models" / model.repo / "config.json"),
        gpus=(GpuDevice(name="CPU (lab)", memory_gib=memory),),
        **serving.model_dump(exclude={"served_model_name", "port"}),
    )
    return plan(request)


def compared_with_plans(report: Any, inventory: Path, bundle: Path) -> Any:
    """The deploy report with a warning for each vLLM fact more than 10% off the lab's plan: of the one
    instance, or of each replica against its service's plan (named by the replica)."""
    if report.vllm is not None:
        return report.compared_with(lab_plan(inventory, bundle))
    plans = {name: lab_plan(inventory, bundle, name) for name in {r.service for r in report.replicas}}
    return report.replicas_compared_with({replica.id: plans[replica.service] for replica in report.replicas})


def chat(endpoint: str, key: str | None, model: str, prompt: str = PROMPT) -> tuple[int, dict[str, Any]]:
    """One chat completion at temperature 0: (HTTP status, JSON body or {})."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 16,
    }
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(f"{endpoint}/chat/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # the lab network only
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}


def api_key_file(inventory: Path) -> Path:
    """Where vllm_service keeps the key by default: ``gpufleet.apikey`` beside the inventory."""
    return inventory.parent / "gpufleet.apikey"


# ----- the demo -----------------------------------------------------------------------------------
def deploy_lab(inventory: Path, bundle: Path, console: Console) -> Any:
    """Every stage from the bundle, shown live; the report compared with the lab's plans (DeployReport)."""
    from gpufleet.runner import deploy  # noqa: PLC0415
    from gpufleet.runner.progress import LiveProgress, print_deploy_report  # noqa: PLC0415

    with LiveProgress(Console(stderr=True)) as live:
        report = deploy(inventory, bundle=bundle, progress=live)
    report = compared_with_plans(report, inventory, bundle)
    print_deploy_report(console, report)
    return report


def listed_models(endpoint: str, key: str | None) -> tuple[int, list[str]]:
    """``GET /v1/models`` through the endpoint: (HTTP status, the model ids it lists)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"{endpoint}/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # the lab network only
            return response.status, [model["id"] for model in json.loads(response.read())["data"]]
    except urllib.error.HTTPError as error:
        return error.code, []


def show_endpoint(report: Any, key_file: Path, models: list[str], console: Console) -> bool:
    """Through the one endpoint from this machine: the model list, a chat with each model with the key;
    without the key 401, an unknown model 404. True when every answer was the expected one."""
    if report.endpoint is None:
        console.print("[red]no endpoint in the report: nothing to ask")
        return False
    key = key_file.read_text(encoding="utf-8").strip()
    status, listed = listed_models(report.endpoint, key)
    console.print(f"GET {report.endpoint}/models: HTTP {status}, {', '.join(listed) or 'no models'}")
    ok = status == 200 and sorted(listed) == sorted(models)
    for model in models:
        status, body = chat(report.endpoint, key, model)
        if status != 200:
            console.print(f"[red]{report.endpoint}/chat/completions (model {model}) answered HTTP {status}")
            ok = False
            continue
        answer = body["choices"][0]["message"]["content"]
        console.print(f"POST {report.endpoint}/chat/completions (model {model}, temperature 0):")
        console.print(f"  user: {PROMPT}\n  {model}: {answer!r}")
    console.print("  (the tiny model has random weights: its answers are deterministic, not meaningful)")
    refused, _ = chat(report.endpoint, None, models[0])
    unknown, _ = chat(report.endpoint, key, "no-such-model")
    console.print(f"  without the API key: HTTP {refused}; model no-such-model: HTTP {unknown}")
    return ok and refused == 401 and unknown == 404


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=bool(getattr(args, "json", False)))  # --json: stdout holds only the JSON
    timings: dict[str, float] = {}
    with step(
        console, "1/4 The lab bundle: Docker, the CPU serving image, the tiny model", timings, "bundle"
    ):
        bundle = build_lab_bundle(args.bundle.resolve(), DIST / "lab-demo", console)
    with step(console, f"2/4 Three offline lab hosts (lab {args.name})", timings, "lab"):
        lab, lab_inventory = ensure_lab(args.name, console)
        route_to_bridge(lab, lab_inventory)
        before = outbound_drops(args.name)
    inventory = services_inventory(
        lab_inventory.inventory, lab_inventory.inventory.parent / "services", DEMO_SERVICES
    )
    models = [str(service["name"]) for service in DEMO_SERVICES]
    with step(
        console,
        f"3/4 Deploy two services ({', '.join(models)}), every stage from the bundle",
        timings,
        "deploy",
    ):
        report = deploy_lab(inventory, bundle, console)
    ok = report.ok
    with step(console, "4/4 The gateway: both models through one endpoint", timings, "endpoint"):
        ok = ok and show_endpoint(report, inventory / "gpufleet.apikey", models, console)
        left = outbound_drops(args.name) - before
        console.print(f"packets the hosts sent beyond the lab during the deploy (dropped): {left}")
    console.rule()
    changes = "no changes" if report.changed == 0 else f"{report.changed} changed tasks"
    console.print(
        f"deploy {'ok' if report.ok else 'FAILED'} in {report.seconds:.0f} s ({changes}); steps: {timings}"
    )
    if args.down:
        lab.down()
        console.print(f"lab {args.name}: taken down")
    else:
        console.print(
            f"lab {args.name} is left up: inventory {inventory}\n"
            f"  .venv/bin/gpufleet status -i {inventory}\n"
            f"  .venv/bin/gpufleet lab ssh --name {args.name} node1\n"
            f"  sudo .venv/bin/gpufleet lab down --name {args.name}    # remove it"
        )
    code = 0 if ok and left == 0 else 1
    if getattr(args, "json", False):
        print(
            json.dumps(
                {
                    "ok": code == 0,
                    "deploy": json.loads(report.model_dump_json()),
                    "endpoint_answered": ok,
                    "packets_beyond_the_lab": left,
                    "seconds": timings,
                    "lab": args.name,
                    "inventory": str(inventory),
                },
                indent=2,
            )
        )
    return code


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="python -m gpufleet.lab.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--name", default=DEMO_LAB, help="lab name (default: %(default)s)")
    parser.add_argument(
        "--bundle",
        type=Path,
        default=DIST / "lab-bundle",
        help="bundle directory (default: dist/lab-bundle in the checkout)",
    )
    parser.add_argument("--down", action="store_true", help="take the lab down at the end")
    parser.add_argument("--json", action="store_true", help="progress on stderr, one JSON object on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    return main_with(build_parser().parse_args(argv))


def main_with(args: argparse.Namespace) -> int:
    """Run the demo; a tool's error (lab, bundle, image, inventory) is one line on stderr and exit 1."""
    from gpufleet.bundle import BuildError, LockError, ManifestError  # noqa: PLC0415
    from gpufleet.lab.serving_image import ImageBuildError  # noqa: PLC0415
    from gpufleet.problems import InventoryError  # noqa: PLC0415
    from gpufleet.runner import DeployError  # noqa: PLC0415

    expected = (RuntimeError, OSError, LabError, BuildError, LockError, ManifestError, ImageBuildError)
    try:
        return run(args)
    except (*expected, InventoryError, DeployError) as error:
        from gpufleet.commands.output import refuse  # noqa: PLC0415

        return refuse([str(error)], code=1, as_json=getattr(args, "json", False), prefix="gpufleet demo: ")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
