"""Turn a raw inventory into a validated FleetSpec, collecting every problem before touching a host."""

from __future__ import annotations

import difflib
import functools
import heapq
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.fleet.compatibility import check_compatibility
from gpufleet.fleet.control import control_problems
from gpufleet.fleet.host_names import host_name_problems
from gpufleet.fleet.inventory import read_inventory
from gpufleet.fleet.pd import pd_problems
from gpufleet.fleet.ports import check_ports
from gpufleet.fleet.raw import RawHost, RawInventory
from gpufleet.fleet.retired import PREFIX as RETIRED_PREFIX
from gpufleet.fleet.retired import group_problems as retired_groups
from gpufleet.fleet.retired import variable_problem as retired_variable
from gpufleet.fleet.role_values import check_values, role_options
from gpufleet.fleet.schema import (
    FLEET_ONLY_VARIABLES,
    INTERNAL_ROLES,
    VARIABLES,
    FleetSpec,
    GpuSpec,
    ModelSpec,
    NodeSpec,
    ServingSpec,
    gpu_memory_gib,
)
from gpufleet.fleet.services import VARIABLE as SERVICES
from gpufleet.fleet.services import model_config, one_model_variables, read_services, service_problems
from gpufleet.paths import project_root
from gpufleet.problems import InventoryError, Problem, merged, without_echoes

if TYPE_CHECKING:
    from gpufleet.planner import PlanRequest

GROUP_FIX = "put every GPU host under gpu_nodes, in ray_head (one host) or ray_workers"


@dataclass
class Validation:
    fleet: FleetSpec | None = None
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class RoleSpecsMissingError(Exception):
    """The roles' argument specs cannot be read: typos in role variables would go unnoticed."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


def role_variables(root: Path | None = None) -> dict[str, str]:
    """Every role input declared in roles/*/meta/argument_specs.yml, mapped to its role.

    Raises RoleSpecsMissingError when there are none to read: validation must never pass silently because
    it could not see what the roles accept.
    """
    root = root or project_root()
    spec_files = sorted(root.glob("roles/*/meta/argument_specs.yml")) if root else []
    if not spec_files:
        raise RoleSpecsMissingError(
            Problem(
                str(root / "roles") if root else "gpufleet (no checkout, no installed collection)",
                "roles/*/meta/argument_specs.yml",
                "none",
                "one per role, to check every role variable",
                "reinstall gpufleet (its wheel carries the roles), or set GPUFLEET_HOME to a checkout",
            )
        )
    found: dict[str, str] = {}
    for spec_file in spec_files:
        role = spec_file.parent.parent.name
        # libyaml's safe loader when PyYAML has it (the same rules, ~10x faster: gpufleet plan -i reads these)
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        specs = yaml.load(spec_file.read_text(encoding="utf-8"), Loader=loader) or {}
        for entry in (specs.get("argument_specs") or {}).values():
            for option in (entry or {}).get("options") or {}:
                found[str(option)] = role
    return found


def validate_inventory(path: Path) -> Validation:
    """Every problem of an inventory, and the FleetSpec when there is none."""
    try:
        raw = read_inventory(path)
    except InventoryError as error:
        return Validation(problems=list(error.problems))
    return validate(raw)


def validate(raw: RawInventory) -> Validation:
    """Every problem of an inventory as Ansible read it (:func:`gpufleet.fleet.load` reads it once)."""
    result = Validation(problems=list(raw.problems))
    nodes = _gpu_nodes(raw, result)
    try:
        roles = role_variables()
    except RoleSpecsMissingError as error:
        result.problems.append(error.problem)
        return result
    options = role_options(project_root() or Path("."))
    result.problems += retired_groups(raw)  # prefill/decode pools: now a service's pd (fleet/retired.py)
    for host in nodes:
        result.problems += _unknown_variables(host, roles)
        result.problems += check_values(host, options)
    result.problems += host_name_problems(raw)
    result.problems += control_problems(raw)
    result.problems += _fleet_wide_differences(nodes, roles)
    result.problems += check_ports(raw, nodes, project_root())
    if not nodes:
        return result
    result.fleet = _build_fleet(raw, nodes, result)
    if result.fleet is not None:
        head = next((host for host in nodes if "ray_head" in host.groups), nodes[0])
        if result.fleet.services:  # each service's replicas on GPUs of their own (fleet/services.py)
            problems, warnings = service_problems(result.fleet)
            result.problems += problems
            result.warnings += warnings
            problems, warnings = pd_problems(result.fleet, head.variables, project_root())
            result.problems += problems
            result.warnings += warnings
        else:
            _check_parallelism(result.fleet, result)
        compatibility = check_compatibility(result.fleet, head.variables, project_root())
        result.problems += compatibility.problems
        result.warnings += compatibility.warnings
    if result.fleet is not None and not result.problems and not result.fleet.services:
        _check_plan(result.fleet, result)
    result.problems = without_echoes(merged(result.problems))
    return result


def _gpu_nodes(raw: RawInventory, result: Validation) -> list[RawHost]:
    heads = raw.members("ray_head")
    if not heads:
        result.problems.append(
            Problem(
                "group ray_head",
                "hosts",
                "no host",
                "exactly one host (the Ray head)",
                "add one host of gpu_nodes to group ray_head",
            )
        )
    elif len(heads) > 1:
        names = ", ".join(host.name for host in heads)
        result.problems.append(
            Problem(
                "group ray_head",
                "hosts",
                f"{len(heads)} hosts ({names})",
                "exactly one host",
                "keep one head and move the others to ray_workers",
            )
        )
    for host in raw.hosts:
        if {"ray_head", "ray_workers"} <= host.groups:
            result.problems.append(
                Problem(
                    f"host {host.name}",
                    "groups",
                    "in ray_head and in ray_workers",
                    "in one of them",
                    "remove it from ray_workers",
                )
            )
        in_ray = bool({"ray_head", "ray_workers"} & host.groups)
        if in_ray != ("gpu_nodes" in host.groups):
            found = "in a ray group but not in gpu_nodes" if in_ray else "in gpu_nodes but in no ray group"
            result.problems.append(
                Problem(
                    f"host {host.name}", "groups", found, "gpu_nodes with ray_head or ray_workers", GROUP_FIX
                )
            )
    nodes = raw.members("gpu_nodes")
    if not nodes:
        result.problems.append(
            Problem(str(raw.path), "gpu_nodes", "no hosts in group gpu_nodes", "at least one host", GROUP_FIX)
        )
    return nodes


def _known(roles: Mapping[str, str]) -> set[str]:
    return set(VARIABLES) | set(FLEET_ONLY_VARIABLES) | set(roles)


def _unknown_variables(host: RawHost, roles: Mapping[str, str]) -> Iterator[Problem]:
    known = frozenset(_known(roles))
    prefixes = ("gpufleet_", "vllm_service_", *(f"{role}_" for role in sorted(set(roles.values()))))
    for name in sorted(host.variables):
        if name.startswith(RETIRED_PREFIX):  # the removed vllm_pd role's: what replaces it (fleet/retired.py)
            yield retired_variable(host.name, name)
            continue
        if (role := roles.get(name)) in INTERNAL_ROLES:
            yield Problem(
                f"host {host.name}",
                name,
                f"an input of the internal {role} role, which the roles that include it set",
                "no such variable in an inventory",
                f"remove it; set the variables of the roles that include it (roles/{role}/README.md names "
                "them)",
            )
            continue
        if name in known or name.startswith("ansible_"):
            continue
        owned = name.startswith(prefixes)
        close = _close(name, owned, known, prefixes)
        if not owned and not close:
            continue  # the user's own variable, in no namespace of ours
        hint = f"did you mean {close}? " if close else ""
        yield Problem(
            f"host {host.name}",
            name,
            "a variable gpufleet does not know",
            "a variable listed in the README's inventory reference",
            f"{hint}Rename or remove it (a misspelt setting would otherwise be ignored)",
        )


@functools.cache
def _close(name: str, owned: bool, known: frozenset[str], prefixes: tuple[str, ...]) -> str | None:
    """The known variable ``name`` most likely misspells, if any: once per name (group variables reach every
    host), among names of about its length (difflib's ratio cannot reach the cutoff otherwise), so that
    thousands of the user's own variables stay fast."""
    cutoff = 0.6 if owned else 0.85
    # A name in one of gpufleet's namespaces is compared with that namespace's names (the longest prefix
    # it has: vllm_service_, not vllm_): a few dozen, not every known variable.
    space = max((prefix for prefix in prefixes if name.startswith(prefix)), key=len, default="")
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(name)
    candidates = []
    for other in sorted(n for n in known if n.startswith(space)):  # difflib.get_close_matches, its full
        # ratio on the 8 likeliest only
        matcher.set_seq1(other)
        if matcher.real_quick_ratio() >= cutoff and (quick := matcher.quick_ratio()) >= cutoff:
            candidates.append((quick, other))
    best: tuple[float, str] | None = None
    for _, other in heapq.nlargest(8, candidates):
        matcher.set_seq1(other)
        if (ratio := matcher.ratio()) >= cutoff and (best is None or ratio > best[0]):
            best = (ratio, other)
    if best is not None:
        return best[1]
    return _by_remainder(known, prefixes).get(name)


@functools.cache
def _by_remainder(known: frozenset[str], prefixes: tuple[str, ...]) -> Mapping[str, str]:
    """``tensor_parallel_size`` -> ``vllm_service_tensor_parallel_size``: settings written without their
    namespace (the first known name in sorted order, as the list once gave)."""
    found: dict[str, str] = {}
    for known_name in sorted(known):
        rest = _unprefixed(known_name, prefixes)
        if rest is not None:
            found.setdefault(rest, known_name)
    return found


def _unprefixed(name: str, prefixes: tuple[str, ...]) -> str | None:
    """``tensor_parallel_size`` for ``vllm_service_tensor_parallel_size``: a setting written without its
    namespace. Only multi-word remainders count, so a user's own ``port`` or ``version`` is left alone."""
    for prefix in prefixes:
        rest = name.removeprefix(prefix)
        if rest != name and "_" in rest:
            return rest
    return None


def _fleet_wide_differences(nodes: list[RawHost], roles: Mapping[str, str]) -> Iterator[Problem]:
    """Settings that must be identical on every node: the model, serving, versions and images."""
    fleet_wide = [name for name, var in VARIABLES.items() if not var.per_host]
    fleet_wide += [name for name in roles if "version" in name or name.endswith("_image")]
    for name in sorted(fleet_wide):
        values = {host.name: host.variables.get(name) for host in nodes if name in host.variables}
        if len({repr(value) for value in values.values()}) > 1:
            found = ", ".join(f"{value!r} on {host}" for host, value in values.items())
            yield Problem(
                "group gpu_nodes",
                name,
                found,
                "one value on every node (no version skew)",
                f"set {name} once, in group_vars/gpu_nodes.yml, and remove the per-host values",
            )


def _section(host: RawHost, section: str) -> dict[str, Any]:
    return {
        var.field: host.variables[name]
        for name, var in VARIABLES.items()
        if var.section == section and name in host.variables
    }


def _build(model: type[BaseModel], data: dict[str, Any], section: str, where: str, result: Validation) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        for detail in error.errors():
            result.problems.append(_problem_from_pydantic(detail, section, where))
        return None


def _variable_for(section: str, field_name: str) -> str:
    for name, var in VARIABLES.items():
        if var.section == section and var.field == field_name:
            return name
    return field_name


def _problem_from_pydantic(detail: Mapping[str, Any], section: str, where: str) -> Problem:
    field_name = str(detail["loc"][0]) if detail["loc"] else ""
    variable = _variable_for(section, field_name)
    if detail["type"] == "missing":
        return Problem(
            where,
            variable,
            "nothing (the variable is not set)",
            "a value",
            f"set {variable} (see the README's inventory reference)",
        )
    expected = str(detail["msg"]).removeprefix("Value error, ")
    expected = expected[0].lower() + expected[1:] if expected else expected
    return Problem(where, variable, repr(detail.get("input")), expected, f"set {variable} to a valid value")


def _build_node(host: RawHost, result: Validation) -> NodeSpec | None:
    where = f"host {host.name}"
    gpus = _build(GpuSpec, _section(host, "gpus"), "gpus", where, result)
    node_data = _section(host, "node") | {
        "name": host.name,
        "ansible_host": str(host.variables.get("ansible_host", host.name)),
        "role": "head" if "ray_head" in host.groups else "worker",
        "gpus": gpus or GpuSpec(),
    }
    node: NodeSpec | None = _build(NodeSpec, node_data, "node", where, result)
    needs_memory = node is not None and gpus is not None and node.gpu and node.gpus.count > 0
    if needs_memory and node is not None and gpu_memory_gib(node.gpus) is None:
        result.problems.append(
            Problem(
                where,
                "gpufleet_gpu_memory_gib",
                f"GPU model {node.gpus.model!r} with no memory size",
                "the memory of one GPU in GiB, as CUDA reports it",
                "set gpufleet_gpu_memory_gib (nvidia-smi --query-gpu=memory.total shows MiB)",
            )
        )
    return node if gpus is not None else None


def _build_fleet(raw: RawInventory, hosts: list[RawHost], result: Validation) -> FleetSpec | None:
    nodes = [_build_node(host, result) for host in hosts]
    head = next((host for host in hosts if "ray_head" in host.groups), hosts[0])
    groups: dict[str, list[str]] = {}
    for host in hosts:
        for group in sorted(host.groups):
            groups.setdefault(group, []).append(host.name)
    services, problems = read_services(head.variables.get(SERVICES), groups)
    result.problems += problems
    if head.variables.get(SERVICES) is not None:  # the services say each model and its serving
        result.problems += one_model_variables(head)
        if not services:
            return None  # read_services said why
        model, serving = services[0].model, services[0].serving
    else:
        model = _build(ModelSpec, _section(head, "model"), "model", "group gpu_nodes", result)
        serving = _build(ServingSpec, _section(head, "serving"), "serving", "group gpu_nodes", result)
    result.problems += _duplicates([node for node in nodes if node is not None])
    bundle = head.variables.get("gpufleet_bundle_dir")
    if bundle is not None and not isinstance(bundle, str):
        result.problems.append(
            Problem(
                "group gpu_nodes",
                "gpufleet_bundle_dir",
                repr(bundle),
                "the path of a bundle directory on the control node, as a string",
                "set gpufleet_bundle_dir to the directory `gpufleet bundle build --out` wrote",
            )
        )
    elif bundle:
        result.problems += _bundle_problems(raw, Path(bundle))
    if result.problems or model is None or serving is None or None in nodes:
        return None
    try:
        return FleetSpec(
            nodes=tuple(n for n in nodes if n is not None),
            model=model,
            serving=serving,
            services=services,
            bundle_dir=Path(bundle) if bundle else None,
            inventory=raw.path,
        )
    except ValidationError as error:  # said, never swallowed: a check here that the group checks lack
        for detail in error.errors():
            where = ".".join(str(part) for part in detail["loc"]) or "the fleet"
            expected = str(detail["msg"]).removeprefix("Value error, ")
            result.problems.append(
                Problem(
                    "inventory",
                    where,
                    repr(detail.get("input"))[:200],
                    expected,
                    "correct the inventory so that it describes one fleet (see `gpufleet init`)",
                )
            )
        return None


def _bundle_problems(raw: RawInventory, bundle: Path) -> list[Problem]:
    """gpufleet_bundle_dir must be a bundle whose lock gpufleet can read (relative: to the inventory)."""
    from gpufleet.bundle.lock import LOCK_NAME, LockError, read_lock  # noqa: PLC0415  (only with a bundle)

    inventory_dir = raw.path if raw.path.is_dir() else raw.path.parent
    path = bundle if bundle.is_absolute() else inventory_dir / bundle
    fix = "set gpufleet_bundle_dir to the directory `gpufleet bundle build --out` wrote"
    if not path.is_dir():
        found = "a file" if path.exists() else "no such directory"
        return [
            Problem("group gpu_nodes", "gpufleet_bundle_dir", f"{path}: {found}", "a bundle directory", fix)
        ]
    if not (path / LOCK_NAME).is_file():
        return [
            Problem(
                "group gpu_nodes",
                "gpufleet_bundle_dir",
                f"{path}: no {LOCK_NAME} in it",
                "a bundle directory written by `gpufleet bundle build`",
                fix,
            )
        ]
    try:
        read_lock(path)
    except LockError as error:
        said = str(error).split(" Fix: ")[0].rstrip(".")
        return [
            Problem(
                "group gpu_nodes",
                "gpufleet_bundle_dir",
                f"an unreadable lock ({said})",
                f"a readable {LOCK_NAME}",
                "rebuild the bundle with `gpufleet bundle build`, or " + fix,
            )
        ]
    return []


def _duplicates(nodes: list[NodeSpec]) -> Iterator[Problem]:
    for attribute, variable in (("node_ip", "gpufleet_node_ip"), ("ansible_host", "ansible_host")):
        seen: dict[str, str] = {}
        for node in nodes:
            value = str(getattr(node, attribute))
            if value in seen:
                yield Problem(
                    f"hosts {seen[value]} and {node.name}",
                    variable,
                    f"{value} on both",
                    "a different address for each host",
                    f"give each host its own {variable} (two names for one machine?)",
                )
            seen.setdefault(value, node.name)


def _check_parallelism(fleet: FleetSpec, result: Validation) -> None:
    gpu_nodes = [node for node in fleet.nodes if node.gpu]
    if not gpu_nodes:
        result.warnings.append(
            "no node has gpufleet_gpu: true (a lab): GPU counts and memory are not planned"
        )
        return
    serving = fleet.serving
    declared = ", ".join(f"{node.name}: {node.gpus.count}" for node in gpu_nodes)
    total = sum(node.gpus.count for node in gpu_nodes)
    if serving.world_size != total:
        result.problems.append(
            Problem(
                "group gpu_nodes",
                "vllm_service_tensor_parallel_size x vllm_service_pipeline_parallel_size",
                f"{serving.tensor_parallel_size} x {serving.pipeline_parallel_size} = "
                f"{serving.world_size} GPUs",
                f"the {total} GPUs the inventory declares ({declared})",
                "make tensor x pipeline parallel size equal the GPU count (commonly TP = GPUs per node, "
                "PP = nodes), or correct gpufleet_gpu_count",
            )
        )
        return
    per_node = max(node.gpus.count for node in gpu_nodes)
    if serving.tensor_parallel_size > per_node and len(gpu_nodes) > 1:
        result.warnings.append(
            f"tensor parallelism spans nodes (TP={serving.tensor_parallel_size}, at most {per_node} GPU(s) "
            f"per node): every layer's all-reduce crosses the network; TP={per_node} with "
            f"PP={serving.world_size // per_node} is usually faster"
        )


def node_gpu_memory(fleet: FleetSpec) -> list[tuple[str, float]]:
    """(name, GiB) for every GPU of the fleet, in node order."""
    devices: list[tuple[str, float]] = []
    for node in fleet.nodes:
        memory = gpu_memory_gib(node.gpus)
        if node.gpu and memory is not None:
            label = f"{node.gpus.model or 'GPU'} on {node.name}"
            devices += [(label, memory)] * node.gpus.count
    return devices


def model_config_path(fleet: FleetSpec) -> Path | None:
    """The model's config.json on the control node (relative paths are relative to the inventory)."""
    return model_config(fleet, fleet.model)


def plan_request(fleet: FleetSpec) -> tuple[PlanRequest | None, list[Problem]]:
    """The planner's input for a fleet, or the problems that keep it from being planned."""
    from gpufleet.planner import GpuDevice, PlannerInputError, PlanRequest, load_model_config  # noqa: PLC0415

    config_path = model_config_path(fleet)
    if config_path is None:
        return None, [
            Problem(
                "group gpu_nodes",
                "gpufleet_model_config",
                "not set",
                "the path of the model's config.json on this machine",
                "set gpufleet_model_config (a copy of the model's config.json is enough)",
            )
        ]
    try:
        hf_config = load_model_config(config_path)
    except PlannerInputError as error:
        return None, [
            Problem(
                "group gpu_nodes",
                "gpufleet_model_config",
                str(config_path),
                "a readable config.json",
                f"{error}; point gpufleet_model_config at the model's config.json",
            )
        ]
    devices = node_gpu_memory(fleet)
    if not devices:
        return None, []
    serving = fleet.serving
    request = PlanRequest(
        hf_config=hf_config,
        gpus=tuple(GpuDevice(name=name, memory_gib=memory) for name, memory in devices),
        **serving.model_dump(exclude={"served_model_name", "port"}),
    )
    return request, []


# The planner's own line for a config.json value: "config.json: KEY: found X; expected Y. Fix: Z".
_PLANNER_LINE = re.compile(
    r"(?s)[^:]*: (?P<key>[^:]+): found (?P<found>.*?); expected (?P<expected>.*?)\. Fix: (?P<fix>.*)"
)


def config_problem(config: Path | None, error: Exception) -> Problem:
    """One problem line for a config.json value the planner refuses: the file where, the key what (the
    planner's own line, not wrapped in another one)."""
    line = _PLANNER_LINE.fullmatch(str(error))
    if line is None:
        return Problem(
            "group gpu_nodes", "gpufleet_model_config", str(config), "the model's own config.json", str(error)
        )
    return Problem(
        str(config),
        line["key"],
        line["found"],
        line["expected"],
        f"{line['fix']}; point gpufleet_model_config at the model's own config.json",
    )


def _check_plan(fleet: FleetSpec, result: Validation) -> None:
    if model_config_path(fleet) is None:
        result.warnings.append(
            "gpufleet_model_config is not set: the model's memory was not planned "
            "(point it at a copy of the model's config.json)"
        )
        return
    request, problems = plan_request(fleet)
    result.problems += problems
    if request is None:
        return
    from gpufleet.planner import PlannerInputError, PlannerUnmodelledError, plan  # noqa: PLC0415

    try:
        outcome = plan(request)
    except PlannerUnmodelledError as unmodelled:  # a valid model the planner does not model (vision, ...)
        result.warnings.append(f"the model's memory was not planned: {unmodelled}")
        return
    except PlannerInputError as wrong:  # a config.json value no model has (hidden_size: true, ...)
        result.problems.append(config_problem(model_config_path(fleet), wrong))
        return
    for error in outcome.errors:
        result.problems.append(
            Problem(
                "group gpu_nodes",
                "vllm_service_* (planner)",
                error,
                "a configuration vLLM accepts",
                "see `gpufleet plan -i INVENTORY`",
            )
        )
    result.warnings += outcome.warnings
