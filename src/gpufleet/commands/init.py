"""``gpufleet init DIR``: write a new inventory from the collection's ``templates/inventory``.

    gpufleet init inventories/new --head gpu-head-01=192.0.2.10 --worker gpu-worker-01=192.0.2.11 \\
        --model Qwen/Qwen2.5-1.5B-Instruct --gpu "NVIDIA H800" --gpus-per-node 8

``HOST=IP`` uses IP for SSH and for the cluster network; ``HOST=SSH_IP,NODE_IP`` gives them apart. Each model
is a service (``gpufleet_services``, README "Services"): ``--replicas`` of ``--tensor-parallel-size`` GPUs
each, inside one node (default: as many replicas of one GPU as fit). ``--one-instance`` writes the one-model
form instead (``gpufleet_model_*``, ``vllm_service_*``), one instance over every GPU, for a model no node can
hold: tensor parallelism spans the GPUs of a node and pipeline parallelism the nodes, as vLLM advises for
multi-node serving. It writes only what ``gpufleet validate`` accepts: the files are rendered in memory, every
given value as a YAML scalar that reads back as itself, and checked as validate checks them
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
from gpufleet.fleet.schema import REPO_PATTERN, SERVICE_NAME
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
    many: dict[str, Any] = {"action": "append", "default": []}  # once for every --model, or once per --model
    parser.add_argument(
        "--model",
        **many,
        required=True,
        metavar="[SERVICE=]ORG/NAME",
        help="ModelScope repository id, served as a service (named after NAME unless SERVICE=); repeatable",
    )
    parser.add_argument("--gpu", required=True, metavar="MODEL", help="GPU model as nvidia-smi names it")
    parser.add_argument("--gpus-per-node", type=int, default=1, metavar="N", help="GPUs per node (default 1)")
    parser.add_argument(
        "--gpu-memory-gib", type=float, metavar="GIB", help="one GPU's memory as CUDA reports it"
    )
    parser.add_argument("--nic", default="eth0", help="interface carrying the cluster network (default eth0)")
    parser.add_argument(
        "--model-config",
        **many,
        type=Path,
        metavar="CONFIG_JSON",
        help="the model's config.json (per --model)",
    )
    parser.add_argument(
        "--replicas",
        **many,
        metavar="auto|N",
        help="replicas of each model's service: auto (as many as fit, the default) or a number",
    )
    parser.add_argument(
        "--tensor-parallel-size", **many, metavar="T", help="GPUs of one replica, in one node (default 1)"
    )
    parser.add_argument(
        "--one-instance",
        action="store_true",
        help="write the one-model form, not services: one instance over every GPU of the fleet (tensor "
        "parallel in a node, pipeline parallel across nodes), for a model too large for one node",
    )
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
    env.filters["yaml"] = yaml_scalar
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
    """What the templates need, every given string as a YAML scalar (the services' through the templates'
    ``yaml`` filter); InitError for arguments that cannot be read at all. Whether the values are valid is
    validation's to say (:func:`write_inventory`)."""
    from gpufleet.commands.init_check import Intended  # noqa: PLC0415

    if not str(args.directory).isprintable():
        raise InitError(
            f"gpufleet init: DIR: found {str(args.directory)!r}; expected a path of printable characters "
            "(init writes it into the files' comments). Fix: choose another DIR"
        )
    if args.gpus_per_node < 1:  # validation would take 0 as a node without GPUs: a replica on its CPU
        raise InitError(
            f"gpufleet init: --gpus-per-node (gpufleet_gpu_count): found {args.gpus_per_node}; expected the "
            "GPUs of each node, at least 1. Fix: give the number of GPUs in each node, e.g. --gpus-per-node 8"
        )
    nodes = _nodes(args)
    models = _models(args)
    configs = _model_configs(args, len(models))
    if args.one_instance:
        fleet_wide, form = _one_instance(args, models[0][1], configs[0], len(nodes))
    else:
        fleet_wide, form = _services(args, models, configs)
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
        fleet_wide=fleet_wide,
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
        "services": [],
        **form,
    }


def _nodes(args: argparse.Namespace) -> list[Node]:
    nodes = [_node(args.head, head=True), *(_node(spec, head=False) for spec in args.worker)]
    for what in ("name", "ssh_ip", "node_ip"):
        values = [getattr(node, what) for node in nodes]
        if dupes := sorted({value for value in values if values.count(value) > 1}):
            raise InitError(
                f"gpufleet init: --head/--worker: found {what.replace('_', ' ')} {', '.join(dupes)} "
                "more than once; expected each host once. Fix: give every host its own name and addresses"
            )
    return nodes


def _models(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Each --model as (its service's name, ORG/NAME), checked first with the schema's rules: NAME is written
    inside a path (the model's dir) and names the service unless ``SERVICE=`` does."""
    if args.one_instance and (len(args.model) > 1 or "=" in args.model[0]):
        raise InitError(
            f"gpufleet init: --model: found {', '.join(args.model)} with --one-instance; expected one "
            "ORG/NAME (the one-model form serves one model, not services). Fix: give one --model ORG/NAME, "
            "or drop --one-instance (a service per --model)"
        )
    variable = "gpufleet_model_repo" if args.one_instance else "gpufleet_services[].model.repo"
    models = []
    for spec in args.model:
        service, named, repo = spec.rpartition("=")
        if not re.fullmatch(REPO_PATTERN, repo):
            raise InitError(
                f"gpufleet init: --model ({variable}): found {repo!r}; expected ORG/NAME "
                "(letters, digits, '_', '.' and '-', each part starting with a letter or a digit). "
                "Fix: e.g. --model Qwen/Qwen3-8B"
            )
        service = service if named else service_name(repo.split("/", 1)[1])
        if not re.fullmatch(SERVICE_NAME, service):
            raise InitError(
                f"gpufleet init: --model (gpufleet_services[].name): found {service!r}; expected a service "
                "name of a-z, 0-9 and '-', at most 28, starting and ending with a letter or a digit. "
                f"Fix: e.g. --model qwen={repo}"
            )
        models.append((service, repo))
    names = [name for name, _ in models]
    if dupes := sorted({name for name in names if names.count(name) > 1}):
        raise InitError(
            f"gpufleet init: --model (gpufleet_services[].name): found service {', '.join(dupes)} more than "
            "once; expected a service per model, each its own name. Fix: give each model once, or name "
            "them: --model SERVICE=ORG/NAME"
        )
    return models


def _model_configs(args: argparse.Namespace, count: int) -> list[str | None]:
    """Each model's config.json relative to DIR (as the inventory writes it), or None where none is given."""
    given: list[Path] = args.model_config
    if not given:
        return [None] * count
    if len(given) != count:
        raise InitError(
            f"gpufleet init: --model-config: found {len(given)} for {count} --model; expected one per "
            "--model, in the same order. Fix: give each --model its --model-config, or none"
        )
    from gpufleet.commands.init_check import model_config_problem  # noqa: PLC0415

    for path in given:
        if problem := model_config_problem(path):
            raise InitError(problem)
    return [os.path.relpath(path.resolve(), args.directory.resolve()) for path in given]


def _one_instance(
    args: argparse.Namespace, model: str, config: str | None, nodes: int
) -> tuple[dict[str, object], dict[str, object]]:
    """The one-model form: what init means to write, and the template's values."""
    for option, values in (
        ("--replicas", args.replicas),
        ("--tensor-parallel-size", args.tensor_parallel_size),
    ):
        if values:
            raise InitError(
                f"gpufleet init: {option}: found {values[0]!r} with --one-instance; expected no {option} "
                "(the one-model form is one instance over every GPU). Fix: drop it, or drop --one-instance"
            )
    name = model.split("/", 1)[1]
    return {"gpufleet_model_repo": model}, {
        "model": yaml_scalar(model),
        "model_name": name,
        "model_config": json.dumps(config) if config else None,
        "served_model_name": yaml_scalar(name.lower()),
        "tensor_parallel_size": args.gpus_per_node,
        "pipeline_parallel_size": nodes,
        "world_size": args.gpus_per_node * nodes,
    }


def _services(
    args: argparse.Namespace, models: list[tuple[str, str]], configs: list[str | None]
) -> tuple[dict[str, object], dict[str, object]]:
    """A service per model: what init means to write (``gpufleet_services``), and the template's values."""
    replicas = [_replicas(value) for value in _per_model(args.replicas, "--replicas", len(models), "auto")]
    sizes = [
        _tensor_parallel_size(value)
        for value in _per_model(args.tensor_parallel_size, "--tensor-parallel-size", len(models), "1")
    ]
    services = [
        {
            "name": service,
            "model": {"repo": repo, "dir": f"/opt/models/{repo.split('/', 1)[1]}"}
            | ({"config": config} if config else {}),
            "replicas": count,
            "serving": {"tensor_parallel_size": size, "served_model_name": repo.split("/", 1)[1].lower()},
        }
        for (service, repo), config, count, size in zip(models, configs, replicas, sizes, strict=True)
    ]
    return {"gpufleet_services": services}, {"services": services}


def service_name(model_name: str) -> str:
    """A service's name from its model's NAME, in the schema's rule (SERVICE_NAME: a-z, 0-9 and '-', at most
    28): Qwen2.5-1.5B-Instruct is qwen2-5-1-5b-instruct."""
    return re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-")[:28].strip("-")


def _per_model(values: list[str], option: str, count: int, default: str) -> list[str]:
    """An option given once for every model, or once per model in order; ``default`` when not given."""
    if len(values) not in (0, 1, count):
        raise InitError(
            f"gpufleet init: {option}: found {len(values)} values for {count} --model; expected one for "
            f"every --model, or one per --model in the same order. Fix: give {option} once, or {count} times"
        )
    return values if len(values) == count else (values or [default]) * count


def _replicas(value: str) -> int | str:
    return "auto" if value == "auto" else _number(value, "--replicas", "auto (as many as fit) or a number")


def _tensor_parallel_size(value: str) -> int:
    return _number(value, "--tensor-parallel-size", "the number of GPUs of one replica, inside one node")


def _number(value: str, option: str, expected: str) -> int:
    if value.isascii() and value.isdigit():
        return int(value)
    variable = "replicas" if option == "--replicas" else "serving.tensor_parallel_size"
    raise InitError(
        f"gpufleet init: {option} (gpufleet_services[].{variable}): found {value!r}; expected {expected}. "
        f"Fix: e.g. {option} 2"
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
