"""``gpufleet init DIR``: write a new inventory from the collection's ``templates/inventory``.

    gpufleet init inventories/new --head gpu-head-01=192.0.2.10 --worker gpu-worker-01=192.0.2.11 \\
        --model Qwen/Qwen2.5-1.5B-Instruct --gpu "NVIDIA H800" --gpus-per-node 8

``HOST=IP`` uses IP for SSH and for the cluster network; ``HOST=SSH_IP,NODE_IP`` gives them apart. Tensor
parallelism spans the GPUs of a node and pipeline parallelism the nodes, as vLLM advises for multi-node
serving. It writes only what ``gpufleet validate`` accepts: the files are rendered in memory, every given
value as a YAML scalar that reads back as itself, and checked as validate checks them
(:mod:`gpufleet.commands.init_check`) before the first is written; ``gpufleet plan`` runs on them (with
``--model-config``). It never overwrites a file without ``--force``.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gpufleet.commands.output import refuse
from gpufleet.fleet.schema import REPO_PATTERN
from gpufleet.paths import project_root

TEMPLATES = Path("templates", "inventory")
# A plain YAML scalar that cannot be a key, a comment or a flow collection; safe_load tells whether YAML
# reads it as a string (true, null, 123 and 1:2:3 are not strings).
PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]*")


class InitError(Exception):
    """Usage problems, each said as one line: what, where, the fix."""

    def __init__(self, *lines: str) -> None:
        self.lines = [str(line) for line in lines]
        super().__init__("\n".join(self.lines))


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
        return refuse(error.lines, code=2, as_json=args.json)
    if args.json:
        print(json.dumps({"ok": True, "inventory": str(args.directory), "written": written}, indent=2))
    else:
        for path in written:
            print(f"wrote {path}")
        print(f"next: gpufleet validate -i {args.directory} && gpufleet plan -i {args.directory}")
    return 0


def write_inventory(args: argparse.Namespace) -> list[str]:
    """Render every template into ``args.directory``; the paths written, or InitError before any write:
    when an argument cannot be read, a file exists (without --force), or validation refuses what would be
    written."""
    import jinja2  # noqa: PLC0415  (only this command renders)

    from gpufleet.commands.init_check import check  # noqa: PLC0415  (imports ansible: only when run)

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
    texts = {
        source.relative_to(templates).with_suffix(""): env.get_template(
            str(source.relative_to(templates))
        ).render(context)
        for source in sources
    }
    # Checked as `-i DIR/hosts.yml`: DIR must exist for a relative --model-config to be found from it.
    created = [folder for folder in (args.directory, *args.directory.parents) if not folder.exists()]
    try:
        args.directory.mkdir(parents=True, exist_ok=True)
        problems = check(args.directory, texts, context["intended"])
        if problems:
            raise InitError(*map(str, problems))
        for text, target in zip(texts.values(), targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    except OSError as error:
        _remove(created)
        raise InitError(
            f"gpufleet init: DIR: found {error.filename or args.directory}: {error.strerror}; expected a "
            "directory init may write. Fix: choose another DIR, or make it writable"
        ) from None
    except BaseException:
        _remove(created)
        raise
    return [str(target) for target in targets]


def _remove(created: list[Path]) -> None:
    """Remove the (empty) directories this run created, innermost first: a refusal leaves nothing behind."""
    for folder in created:
        with contextlib.suppress(OSError):
            folder.rmdir()


def yaml_scalar(value: str) -> str:
    """``value`` as a YAML scalar that reads back as the same string: plain when it is one, else in double
    quotes (JSON's string escapes are YAML's)."""
    if PLAIN.fullmatch(value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)


def yaml_number(value: float) -> str:
    """A float as YAML writes it (``.inf``, ``.nan``: Python's ``inf`` would be read as a string)."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return repr(value)


def _context(args: argparse.Namespace) -> dict[str, Any]:
    """What the templates need, every given string as a YAML scalar; InitError for arguments that cannot be
    read at all. Whether the values are valid is validation's to say (:func:`write_inventory`)."""
    from gpufleet.commands.init_check import Intended  # noqa: PLC0415

    if not str(args.directory).isprintable():
        raise InitError(
            f"gpufleet init: DIR: found {str(args.directory)!r}; expected a path of printable characters "
            "(init writes it into the files' comments). Fix: choose another DIR"
        )
    nodes = [_node(args.head, head=True), *(_node(spec, head=False) for spec in args.worker)]
    for what in ("name", "ssh_ip", "node_ip"):
        values = [getattr(node, what) for node in nodes]
        if dupes := sorted({value for value in values if values.count(value) > 1}):
            raise InitError(
                f"gpufleet init: --head/--worker: found {what.replace('_', ' ')} {', '.join(dupes)} "
                "more than once; expected each host once. Fix: give every host its own name and addresses"
            )
    # The model's name is written inside a path (gpufleet_model_dir): checked first, with the schema's rule.
    if not re.fullmatch(REPO_PATTERN, args.model):
        raise InitError(
            f"gpufleet init: --model (gpufleet_model_repo): found {args.model!r}; expected ORG/NAME "
            "(letters, digits, '_', '.' and '-', each part starting with a letter or a digit). "
            "Fix: e.g. --model Qwen/Qwen3-8B"
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
    memory = args.gpu_memory_gib
    per_host: dict[str, object] = {
        "gpufleet_nic": args.nic,
        "gpufleet_gpu_count": args.gpus_per_node,
        "gpufleet_gpu_model": args.gpu,
    } | ({} if memory is None else {"gpufleet_gpu_memory_gib": memory})
    intended = Intended(
        head=nodes[0].name,
        hosts={
            node.name: {"ansible_host": node.ssh_ip, "gpufleet_node_ip": node.node_ip, **per_host}
            for node in nodes
        },
        fleet_wide={"gpufleet_model_repo": args.model},
    )
    quoted = [
        replace(
            node,
            name=yaml_scalar(node.name),
            ssh_ip=yaml_scalar(node.ssh_ip),
            node_ip=yaml_scalar(node.node_ip),
        )
        for node in nodes
    ]
    return {
        "intended": intended,
        "directory": str(args.directory),
        "nodes": quoted,
        "workers": [node for node in quoted if not node.head],
        "nic": yaml_scalar(args.nic),
        "gpu": yaml_scalar(args.gpu),
        "gpus_per_node": args.gpus_per_node,
        "gpu_memory_gib": None if memory is None else yaml_number(memory),
        "model": yaml_scalar(args.model),
        "model_name": name,
        "model_config": json.dumps(model_config) if model_config else None,
        "served_model_name": yaml_scalar(name.lower()),
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
    except RecursionError:
        raise InitError(
            f"gpufleet init: --model-config: {path}: found JSON nested too deep to read; expected the "
            f"model's config.json (a JSON object a few levels deep). {fix}"
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
    if not sep or not name:  # the name's rules are validation's (gpufleet.fleet.host_names)
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
