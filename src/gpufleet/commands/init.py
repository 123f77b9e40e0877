"""``gpufleet init DIR``: write a new inventory from the collection's ``templates/inventory``.

    gpufleet init inventories/new --head gpu-head-01=192.0.2.10 --worker gpu-worker-01=192.0.2.11 \\
        --model Qwen/Qwen2.5-1.5B-Instruct --gpu "NVIDIA H800" --gpus-per-node 8

``HOST=IP`` uses IP for SSH and for the cluster network; ``HOST=SSH_IP,NODE_IP`` gives them apart. Tensor
parallelism spans the GPUs of a node and pipeline parallelism the nodes, as vLLM advises for multi-node
serving. What it writes validates, and ``gpufleet plan`` runs on it (with ``--model-config``). It never
overwrites a file without ``--force``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.commands.output import refuse
from gpufleet.paths import project_root

HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MODEL = re.compile(r"^[\w.-]+/[\w.-]+$")
TEMPLATES = Path("templates", "inventory")


class InitError(Exception):
    """A usage problem, said as one line: what, where, the fix."""


@dataclass(frozen=True)
class Node:
    name: str
    ssh_ip: str
    node_ip: str
    head: bool


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "init",
        help="write a new inventory (hosts, group_vars) from templates, ready for validate and plan",
        description="Write DIR/hosts.yml and DIR/group_vars/ for a new fleet; no overwrite without --force.",
    )
    parser.add_argument("directory", type=Path, metavar="DIR", help="the inventory directory to write")
    parser.add_argument(
        "--head", required=True, metavar="HOST=IP", help="the Ray head (IP or SSH_IP,NODE_IP)"
    )
    parser.add_argument(
        "--worker", action="append", default=[], metavar="HOST=IP", help="a worker node (repeatable)"
    )
    parser.add_argument("--model", required=True, metavar="ORG/NAME", help="ModelScope repository id")
    parser.add_argument("--gpu", required=True, metavar="MODEL", help="GPU model as nvidia-smi names it")
    parser.add_argument("--gpus-per-node", type=int, default=1, metavar="N", help="GPUs per node (default 1)")
    parser.add_argument(
        "--gpu-memory-gib", type=float, metavar="GIB", help="one GPU's memory as CUDA reports it"
    )
    parser.add_argument("--nic", default="eth0", help="interface carrying the cluster network (default eth0)")
    parser.add_argument("--model-config", type=Path, metavar="CONFIG_JSON", help="the model's config.json")
    parser.add_argument("--force", action="store_true", help="overwrite files that exist")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        written = write_inventory(args)
    except InitError as error:
        return refuse([str(error)], code=2, as_json=args.json)
    if args.json:
        print(json.dumps({"ok": True, "inventory": str(args.directory), "written": written}, indent=2))
    else:
        for path in written:
            print(f"wrote {path}")
        print(f"next: gpufleet validate -i {args.directory} && gpufleet plan -i {args.directory}")
    return 0


def write_inventory(args: argparse.Namespace) -> list[str]:
    """Render every template into ``args.directory``; the paths written, or InitError before any write."""
    import jinja2  # noqa: PLC0415  (only this command renders)

    context = _context(args)
    root = project_root()
    templates = root / TEMPLATES if root else None
    if templates is None or not templates.is_dir():
        raise InitError(
            f"gpufleet init: templates: found none ({templates}); expected templates/inventory of the "
            "gpufleet collection. Fix: reinstall gpufleet, or set GPUFLEET_HOME to a gpufleet checkout"
        )
    for parent in (args.directory, *args.directory.parents):
        if parent.exists() and not parent.is_dir():
            raise InitError(
                f"gpufleet init: {args.directory}: found {parent} is a file, not a directory; expected a new "
                "inventory directory. Fix: choose another DIR (init writes DIR/hosts.yml and DIR/group_vars/)"
            )
    sources = sorted(path for path in templates.rglob("*.j2"))
    targets = [args.directory / path.relative_to(templates).with_suffix("") for path in sources]
    existing = [str(target) for target in targets if target.exists()]
    if existing and not args.force:
        raise InitError(
            f"gpufleet init: {', '.join(existing)}: found existing file(s); expected a new inventory. "
            "Fix: choose another DIR, or pass --force to overwrite"
        )
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # YAML, not HTML
    )
    for source, target in zip(sources, targets, strict=True):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(
            env.get_template(str(source.relative_to(templates))).render(context), encoding="utf-8"
        )
    return [str(target) for target in targets]


def _context(args: argparse.Namespace) -> dict[str, Any]:
    nodes = [_node(args.head, head=True), *(_node(spec, head=False) for spec in args.worker)]
    for what in ("name", "ssh_ip", "node_ip"):
        values = [getattr(node, what) for node in nodes]
        if dupes := sorted({value for value in values if values.count(value) > 1}):
            raise InitError(
                f"gpufleet init: --head/--worker: found {what.replace('_', ' ')} {', '.join(dupes)} "
                "more than once; expected each host once. Fix: give every host its own name and addresses"
            )
    if not MODEL.match(args.model) or any(part.startswith(".") for part in args.model.split("/")):
        raise InitError(
            f"gpufleet init: --model: found {args.model!r}; expected ORG/NAME. Fix: e.g. Qwen/Qwen3-8B"
        )
    if args.gpus_per_node < 1:
        raise InitError(
            f"gpufleet init: --gpus-per-node: found {args.gpus_per_node}; expected 1 or more. "
            "Fix: give the number of GPUs in each node, e.g. --gpus-per-node 8"
        )
    if args.gpu_memory_gib is not None and not 0 < args.gpu_memory_gib < 10_000:
        raise InitError(
            f"gpufleet init: --gpu-memory-gib: found {args.gpu_memory_gib}; expected a finite number of GiB "
            "above 0. Fix: give one GPU's memory as CUDA reports it, e.g. --gpu-memory-gib 79.18"
        )
    model_config = None
    if args.model_config is not None:
        if not args.model_config.is_file():
            raise InitError(
                f"gpufleet init: --model-config: {args.model_config}: no such file; expected the model's "
                "config.json. Fix: pass the path of a copy of it"
            )
        _check_model_config(args.model_config)
        model_config = os.path.relpath(args.model_config.resolve(), args.directory.resolve())
    name = args.model.split("/", 1)[1]
    return {
        "directory": str(args.directory),
        "nodes": nodes,
        "workers": [node for node in nodes if not node.head],
        "nic": args.nic,
        "gpu": json.dumps(args.gpu),  # a YAML-safe scalar, whatever the name holds
        "gpus_per_node": args.gpus_per_node,
        "gpu_memory_gib": args.gpu_memory_gib,
        "model": args.model,
        "model_name": name,
        "model_config": json.dumps(model_config) if model_config else None,
        "served_model_name": name.lower(),
        "tensor_parallel_size": args.gpus_per_node,
        "pipeline_parallel_size": len(nodes),
        "world_size": args.gpus_per_node * len(nodes),
    }


def _check_model_config(path: Path) -> None:
    """The planner reads this file on every validate and plan: refuse now what it would refuse then."""
    fix = "Fix: pass a copy of the model's own config.json (from its repository)"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise InitError(
            f"gpufleet init: --model-config: {path}: found bytes that are not UTF-8 at offset {error.start}; "
            f"expected the model's config.json (JSON text). {fix}"
        ) from None
    except (OSError, ValueError) as error:
        raise InitError(
            f"gpufleet init: --model-config: {path}: found {str(error).splitlines()[0]}; expected the "
            f"model's config.json (a JSON object). {fix}"
        ) from None
    if not isinstance(data, dict):
        raise InitError(
            f"gpufleet init: --model-config: {path}: found a JSON {type(data).__name__}; expected a JSON "
            f"object (the model's config.json). {fix}"
        )


def _node(spec: str, *, head: bool) -> Node:
    option = "--head" if head else "--worker"
    name, sep, addresses = spec.partition("=")
    ssh_ip, _, node_ip = addresses.partition(",")
    node_ip = node_ip or ssh_ip
    if not sep or not HOSTNAME.match(name):
        raise InitError(
            f"gpufleet init: {option}: found {spec!r}; expected HOST=IP or HOST=SSH_IP,NODE_IP. "
            f"Fix: e.g. {option} gpu-node-01=192.0.2.10"
        )
    for address in (ssh_ip, node_ip):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise InitError(
                f"gpufleet init: {option} {name}: found address {address!r}; expected an IP address. "
                f"Fix: e.g. {option} {name}=192.0.2.10"
            ) from None
    return Node(name, ssh_ip, node_ip, head)
