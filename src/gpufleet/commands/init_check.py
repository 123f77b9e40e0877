"""What `gpufleet init` would write, checked as `gpufleet validate` checks it, before anything is written.

The rendered files go to a private temporary directory; ansible-core reads them there (the same reading
``validate`` has) and the same validation runs on that reading, with relative paths taken from the real
inventory directory, plus two things validation cannot know: the host names' rules
(:mod:`gpufleet.fleet.host_names`) and that Ansible reads back every value as it was given (a value YAML
reads as something else, say a GPU named ``null`` or a service named ``true``, would pass validation as
another value; each field of a service is compared). Each problem is said with the option to change, a
service's included (``--replicas``, ``--tensor-parallel-size``). A ``--model-config`` is read first, as the
planner reads it (:func:`model_config_problem`).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import astuple, dataclass, replace
from pathlib import Path

from gpufleet.fleet import Fleet, load
from gpufleet.fleet.host_names import host_name_problems
from gpufleet.fleet.raw import RawInventory
from gpufleet.fleet.services import VARIABLE as SERVICES
from gpufleet.problems import Problem, merged

PLANNER = "vllm_service_* (planner)"
SERVICE_PLANNER = f"{SERVICES}[].serving (planner)"
# The option that sets each variable init writes (HOST: --head for the head's, --worker for a worker's).
OPTIONS = {
    "inventory_hostname": "HOST",
    "ansible_host": "HOST",
    "gpufleet_node_ip": "HOST",
    "gpufleet_nic": "--nic",
    "gpufleet_gpu_count": "--gpus-per-node",
    "gpufleet_gpu_model": "--gpu",
    "gpufleet_gpu_memory_gib": "--gpu-memory-gib",
    "gpufleet_model_repo": "--model",
    "gpufleet_model_dir": "--model",
    "gpufleet_model_config": "--model-config",
    "vllm_service_served_model_name": "--model",
    "vllm_service_tensor_parallel_size": "--gpus-per-node",
    "vllm_service_pipeline_parallel_size": "--worker",
    PLANNER: "--gpus-per-node, --worker, --gpu-memory-gib or --model",
    # A service's fields (validation names them within the service; init's read-back with its index).
    f"{SERVICES}[].name": "--model",
    f"{SERVICES}[].model.repo": "--model",
    f"{SERVICES}[].model.dir": "--model",
    f"{SERVICES}[].model.config": "--model-config",
    f"{SERVICES}[].replicas": "--replicas",
    f"{SERVICES}[].tensor_parallel_size": "--tensor-parallel-size",
    f"{SERVICES}[].serving.tensor_parallel_size": "--tensor-parallel-size",
    f"{SERVICES}[].serving.served_model_name": "--model",
    SERVICE_PLANNER: "--tensor-parallel-size, --gpus-per-node, --gpu-memory-gib or --model",
}
FIXES = {
    "--head": "give the head as HOST=IP or HOST=SSH_IP,NODE_IP, e.g. --head gpu-head-01=192.0.2.10",
    "--worker": "give each worker as HOST=IP or HOST=SSH_IP,NODE_IP, e.g. --worker gpu-worker-01=192.0.2.11",
    "--nic": "give the interface that carries the cluster network, e.g. --nic ens1f0 (`ip -br link`)",
    "--gpus-per-node": "give the number of GPUs in each node, e.g. --gpus-per-node 8",
    "--gpu": 'give the GPU model as nvidia-smi names it, e.g. --gpu "NVIDIA H800"',
    "--gpu-memory-gib": "give one GPU's memory as CUDA reports it, e.g. --gpu-memory-gib 79.18 "
    "(nvidia-smi --query-gpu=memory.total shows MiB)",
    "--model": "give the ModelScope repository id as ORG/NAME, e.g. --model Qwen/Qwen3-8B",
    "--model-config": "pass a copy of the model's own config.json",
    OPTIONS[PLANNER]: "give more or larger GPUs, or a smaller model; `gpufleet plan --model CONFIG_JSON "
    "--gpu-memory-gib G --tensor-parallel-size T` shows what fits",
    "--replicas": "give --replicas auto (as many as fit) or a number that fits; several --model share the "
    "GPUs in their order, so give each its own, e.g. --replicas 4 --replicas auto",
    "--tensor-parallel-size": "give the GPUs one replica needs, at most --gpus-per-node, e.g. "
    "--tensor-parallel-size 2; a model too large for one node: --one-instance",
    OPTIONS[SERVICE_PLANNER]: "give each replica more GPUs (--tensor-parallel-size, at most --gpus-per-node) "
    "or larger ones, or a smaller model; `gpufleet plan --model CONFIG_JSON --gpu-memory-gib G "
    "--tensor-parallel-size T` shows what fits; a model too large for one node: --one-instance",
}


@dataclass(frozen=True)
class Intended:
    """What init means to write: each host's group and variables, and the fleet-wide variables."""

    head: str
    hosts: Mapping[str, Mapping[str, object]]
    fleet_wide: Mapping[str, object]


def check(directory: Path, files: Mapping[Path, str], intended: Intended) -> list[Problem]:
    """Every problem of the inventory ``files`` (relative path -> text) would make in ``directory``."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-init-") as temporary, _uncached():
        copy = Path(temporary)
        for relative, text in files.items():
            (copy / relative).parent.mkdir(parents=True, exist_ok=True)
            (copy / relative).write_text(text, encoding="utf-8")
        read = load(copy / "hosts.yml", validate=False)
        if read.raw is None:
            return [_said(problem, intended, copy, directory) for problem in read.problems]
        # Validated as `-i DIR/hosts.yml`: relative paths (the model's config.json) are taken from DIR.
        raw = replace(read.raw, path=directory / "hosts.yml")
        problems = merged(_read_back(raw, intended)) + host_name_problems(raw)
        problems += Fleet(path=raw.path, raw=raw).validate().problems
    unique = dict.fromkeys(_said(problem, intended, copy, directory) for problem in problems)
    return list(unique)


def model_config_problem(path: Path) -> str | None:
    """--model-config's problem as one line, or None: the planner reads the file on every validate and plan,
    so init refuses now what it would refuse then."""
    said = f"gpufleet init: --model-config: {path}: found"
    fix = "Fix: pass a copy of the model's own config.json (from its repository)"
    if not path.is_file():
        return f"{said} no such file; expected the model's config.json. Fix: pass the path of a copy of it"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        return (
            f"{said} bytes that are not UTF-8 at offset {error.start}; expected the model's config.json "
            f"(JSON text). {fix}"
        )
    except RecursionError:
        return (
            f"{said} JSON nested too deep to read; expected the model's config.json (a JSON object a few "
            f"levels deep). {fix}"
        )
    except (OSError, ValueError) as error:
        return f"{said} {str(error).splitlines()[0]}; expected the model's config.json (a JSON object). {fix}"
    if not isinstance(data, dict):
        return f"{said} a JSON {type(data).__name__}; expected a JSON object (the model's config.json). {fix}"
    return None


@contextmanager
def _uncached() -> Iterator[None]:
    """The temporary copy is read once: no entry for it in the inventory cache."""
    before = os.environ.get("GPUFLEET_NO_CACHE")
    os.environ["GPUFLEET_NO_CACHE"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["GPUFLEET_NO_CACHE"]
        else:
            os.environ["GPUFLEET_NO_CACHE"] = before


def _read_back(raw: RawInventory, intended: Intended) -> list[Problem]:
    """Where Ansible's reading differs from what was given: hosts, groups or values."""
    read = {host.name: host for host in raw.hosts}
    if set(read) != set(intended.hosts):
        return [
            Problem(
                "inventory",
                "inventory_hostname",
                f"hosts {sorted(read)} in Ansible's reading",
                f"the hosts given, {sorted(intended.hosts)}",
                "give host names Ansible reads as themselves (no patterns such as [1:3])",
            )
        ]
    problems = []
    for name, variables in intended.hosts.items():
        group = "ray_head" if name == intended.head else "ray_workers"
        if not {group, "gpu_nodes"} <= read[name].groups:
            problems.append(
                Problem(
                    f"host {name}",
                    "inventory_hostname",
                    f"groups {sorted(read[name].groups)} in Ansible's reading",
                    f"{group} and gpu_nodes",
                    "give host names Ansible reads as themselves",
                )
            )
        for variable, value in {**variables, **intended.fleet_wide}.items():
            problems += [
                Problem(
                    f"host {name}",
                    path,
                    f"{found!r} in Ansible's reading of what init would write",
                    f"{given!r}, as given",
                    "give a value YAML reads as itself",
                )
                for path, found, given in _differences(read[name].variables.get(variable), value, variable)
            ]
    return problems


def _differences(found: object, given: object, path: str) -> Iterator[tuple[str, object, object]]:
    """Each value in ``given`` (nested in mappings and lists: a service) that ``found`` does not hold as it
    is: its path, what was found, what was given. repr: 1 is not 1.0 nor "1", and nan is nan."""
    if isinstance(given, Mapping) and isinstance(found, Mapping):
        for key, value in given.items():
            yield from _differences(found.get(key), value, f"{path}.{key}")
    elif isinstance(given, list) and isinstance(found, list) and len(found) == len(given):
        for index, (item, value) in enumerate(zip(found, given, strict=True)):
            yield from _differences(item, value, f"{path}[{index}]")
    elif repr(found) != repr(given):
        yield path, found, given


def _said(problem: Problem, intended: Intended, copy: Path, directory: Path) -> Problem:
    """The problem as init's: the option to change, the fix in its terms, paths in DIR, not the copy."""
    # A service's problem is said within it (gpufleet_services[0] (name): replicas) or by its path in init's
    # read-back (gpufleet_services[0].replicas): either is the same option.
    within = f"{SERVICES}[]." if problem.where.startswith(SERVICES) else ""
    option = OPTIONS.get(re.sub(r"\[\d+\]", "[]", within + problem.variable))
    if option == "HOST":
        if problem.where in (f"host {intended.head}", f"host {intended.head!r}"):
            option = "--head"
        else:
            option = "--worker" if problem.where.startswith("host ") else "--head/--worker"
    where = problem.where if problem.where.isprintable() else repr(problem.where)  # one line, always
    said = Problem(
        "gpufleet init",
        f"{option or problem.variable} ({problem.variable + ' on ' if option else ''}{where})",
        problem.found,
        problem.expected,
        problem.fix if problem.variable == "inventory_hostname" else FIXES.get(option or "", problem.fix),
    )
    return Problem(*(part.replace(str(copy), str(directory)) for part in astuple(said)))
