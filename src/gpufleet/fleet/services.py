"""Services: the models a fleet serves, each as replicas (``gpufleet_services``), placed on the nodes' GPUs.

An inventory lists its services::

    gpufleet_services:
      - name: qwen                      # what clients send as `model`
        model: {repo: Qwen/Qwen2.5-1.5B-Instruct, dir: /opt/models/qwen, config: models/qwen/config.json}
        replicas: auto                  # or a number
        hosts: [gpu_nodes]              # nodes or groups its replicas may use (default: every node)
        serving: {tensor_parallel_size: 1, max_model_len: 8192}   # vllm_service_* names, less the prefix

An inventory written before services (``gpufleet_model_*`` and ``vllm_service_*``) is one service with one
replica over every GPU of the fleet, as it always was (:func:`services_of`). :func:`place_fleet` places the
replicas (:mod:`gpufleet.planner.placement`) and :func:`replica_requests` gives each replica the planner's
input for its own GPUs, so that a 3090 replica and an H800 replica each get their own memory plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpufleet.fleet.raw import RawHost
from gpufleet.fleet.schema import PD_ROLES, VARIABLES, FleetSpec, ModelSpec, ServiceSpec, gpu_memory_gib
from gpufleet.planner.placement import Node, Placement, PlacementError, Replica, Shape, place
from gpufleet.problems import Problem

if TYPE_CHECKING:
    from gpufleet.planner import Plan, PlanRequest

VARIABLE = "gpufleet_services"
LEGACY_NAME = "default"  # the one service of an inventory before services: instance `default`, as before


def read_services(
    value: Any, groups: Mapping[str, Sequence[str]]
) -> tuple[tuple[ServiceSpec, ...], list[Problem]]:
    """``gpufleet_services`` as the inventory wrote it, typed; ``hosts`` naming groups become their members.
    Every problem is one line naming the service (by its position when it has no usable name)."""
    if value is None:
        return (), []
    if not isinstance(value, list) or not value:
        return (), [
            Problem(
                "group gpu_nodes",
                VARIABLE,
                repr(value)[:200],
                "a list of services, each a mapping with name, model and replicas",
                "write gpufleet_services as a YAML list (see the README's Services section)",
            )
        ]
    services: list[ServiceSpec] = []
    problems: list[Problem] = []
    for index, item in enumerate(value):
        where = f"{VARIABLE}[{index}]"
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            where += f" ({item['name']})"
        if not isinstance(item, dict):
            problems.append(
                Problem(
                    where,
                    VARIABLE,
                    repr(item)[:200],
                    "a mapping (name, model, replicas, ...)",
                    "write each service as a mapping",
                )
            )
            continue
        data = dict(item)
        if isinstance(data.get("hosts"), list):
            data["hosts"] = _expand(data["hosts"], groups)
        if isinstance(data.get("pd"), dict):  # a P/D service's roles name their own nodes or groups
            data["pd"] = dict(data["pd"])
            for role in PD_ROLES:
                spec = data["pd"].get(role)
                if isinstance(spec, dict) and isinstance(spec.get("hosts"), list):
                    data["pd"][role] = {**spec, "hosts": _expand(spec["hosts"], groups)}
        try:
            services.append(ServiceSpec.model_validate(data))
        except ValidationError as error:
            for detail in error.errors():
                field = ".".join(str(part) for part in detail["loc"]) or "the service"
                if detail["type"] == "missing":
                    problems.append(Problem(where, field, "nothing (not set)", "a value", f"set {field}"))
                    continue
                expected = str(detail["msg"]).removeprefix("Value error, ")
                problems.append(
                    Problem(
                        where,
                        field,
                        repr(detail.get("input"))[:200],
                        expected,
                        f"set {field} to a valid value",
                    )
                )
    return tuple(services), problems


def one_model_variables(head: RawHost) -> list[Problem]:
    """The model and serving variables of an inventory before services, set beside ``gpufleet_services``
    (where they would mean nothing: each service says its own)."""
    both = sorted(
        name
        for name, variable in VARIABLES.items()
        if variable.section in ("model", "serving") and name in head.variables
    )
    return [
        Problem(
            "group gpu_nodes",
            name,
            f"{head.variables[name]!r} beside {VARIABLE}",
            f"each service's own model and serving settings in {VARIABLE}",
            f"move it into the service it belongs to ({VARIABLE}[].model or [].serving), or remove it",
        )
        for name in both
    ]


def not_deployable(fleet: FleetSpec) -> list[Problem]:
    """What a deploy of this fleet cannot run yet, refused before any host is touched: a service's replica
    over several nodes (the one-model form's instance over the fleet runs through Ray; a service's replicas
    run inside one node each, playbooks/serve.yml)."""
    if not fleet.services:
        return []
    return [
        Problem(
            f"{VARIABLE}: {replica.id}",
            "serving (tensor_parallel_size x pipeline_parallel_size)",
            f"a replica over {len(replica.members)} nodes ({', '.join(m.node for m in replica.members)})",
            "replicas inside one node each: this release runs an instance over nodes only in the one-model "
            "form (gpufleet_model_* and vllm_service_*)",
            "give the service a shape that fits the GPUs of one node, or deploy the one-model form",
        )
        for replica in place_fleet(fleet).replicas
        if len(replica.members) > 1
    ]


def _expand(hosts: list[Any], groups: Mapping[str, Sequence[str]]) -> list[Any]:
    """Group names among ``hosts`` replaced by their members (in the group's order, once each)."""
    expanded: list[Any] = []
    for host in hosts:
        for name in groups.get(host, [host]) if isinstance(host, str) else [host]:
            if name not in expanded:
                expanded.append(name)
    return expanded


def services_of(fleet: FleetSpec) -> tuple[ServiceSpec, ...]:
    """The fleet's services: its own list, or the one service an inventory before services describes."""
    if fleet.services:
        return fleet.services
    return (
        ServiceSpec(
            name=LEGACY_NAME,  # its replica is today's instance, `default`
            model=fleet.model,
            replicas=1,
            serving=fleet.serving,
        ),
    )


def place_fleet(fleet: FleetSpec) -> Placement:
    """Every replica of every service on its node's GPUs; PlacementError with a line per service that does
    not fit. A node with ``gpufleet_gpu: false`` (the CPU build of vLLM) has no GPUs to place."""
    nodes = [Node(node.name, node.gpus.count if node.gpu else 0) for node in fleet.nodes]
    head_first = sorted(nodes, key=lambda node: node.name != fleet.head.name)
    legacy = not fleet.services
    shapes: list[Shape] = []
    for service in services_of(fleet):
        if service.pd is None:
            shapes.append(
                Shape(
                    service=service.name,
                    tensor_parallel_size=service.serving.tensor_parallel_size,
                    pipeline_parallel_size=service.serving.pipeline_parallel_size,
                    replicas=None if service.replicas == "auto" else service.replicas,
                    hosts=service.hosts,
                    port=service.serving.port
                    if legacy or "port" in service.serving.model_fields_set
                    else None,
                    spans_fleet=legacy,
                )
            )
            continue
        for role in PD_ROLES:  # two shapes: the prefill replicas, then the decode ones
            spec, serving = service.pd.role(role), service.serving_of(role)
            set_port = "port" in spec.serving.model_fields_set or "port" in service.serving.model_fields_set
            shapes.append(
                Shape(
                    service=service.name,
                    tensor_parallel_size=serving.tensor_parallel_size,
                    pipeline_parallel_size=serving.pipeline_parallel_size,
                    replicas=None if spec.replicas == "auto" else spec.replicas,
                    hosts=spec.hosts,
                    port=serving.port if set_port else None,
                    role=role,
                    side_channel_port=service.pd.side_channel_port,
                )
            )
    return place(head_first, shapes)


def served(fleet: FleetSpec) -> str:
    """What a valid fleet serves, for ``gpufleet validate``'s summary: the model of an inventory before
    services; else each service with its model and the replicas placed (``replicas: auto`` counted)."""
    if not fleet.services:
        return f"model {fleet.model.repo}"
    placement = place_fleet(fleet)
    described = []
    for service in fleet.services:
        shapes = []
        for role in PD_ROLES if service.pd is not None else (None,):
            replicas = [replica for replica in placement.of(service.name) if replica.role == role]
            gpus = sum(len(member.gpus) for member in replicas[0].members) if replicas else 0
            kind = f"{role} replica(s)" if role else "replica(s)"
            shapes.append(
                f"{len(replicas)} {kind} of {gpus} GPU(s)" if gpus else f"{len(replicas)} {kind} on CPU"
            )
        asked = ", replicas: auto" if service.replicas == "auto" else ""
        described.append(f"{service.name} ({service.model.repo}) as {' and '.join(shapes)}{asked}")
    return f"{len(fleet.services)} service(s): " + "; ".join(described)


def service_problems(fleet: FleetSpec) -> tuple[list[Problem], list[str]]:
    """What keeps the services from being placed, or a replica from starting on its own GPUs (the planner's
    errors, per replica); and the planner's warnings. A service without a config.json is not planned (a
    warning says so)."""
    planned = plan_replicas(fleet)
    return planned.problems, planned.warnings


@dataclass(frozen=True)
class PlannedReplicas:
    """Every replica planned on its own GPUs (:func:`plan_replicas`): the plans by replica id, what keeps the
    services from being placed or planned, and the planner's warnings."""

    plans: Mapping[str, Plan]
    problems: list[Problem]
    warnings: list[str]


def plan_replicas(fleet: FleetSpec) -> PlannedReplicas:
    """Place the services and plan each replica on its own GPUs: what validation refuses, what the deploy
    report compares each replica's vLLM with. A service without a config.json, or a replica on GPUs of unknown
    memory (the lab's CPU build), is not planned."""
    try:
        placement = place_fleet(fleet)
    except PlacementError as error:
        problems = [
            Problem(f"{VARIABLE}: {p.where}", p.variable, p.found, p.expected, p.fix) for p in error.problems
        ]
        return PlannedReplicas({}, problems, [])
    from gpufleet.planner import PlannerInputError, PlannerUnmodelledError, load_model_config, plan  # noqa: PLC0415

    configs: dict[str, dict[str, Any]] = {}
    problems, warnings = [], []
    for service in services_of(fleet):
        path = model_config(fleet, service.model)
        if path is None:
            warnings.append(f"service {service.name}: model.config is not set: its memory was not planned")
            continue
        try:
            configs[service.name] = load_model_config(path)
        except PlannerInputError as error:
            problems.append(
                Problem(
                    f"{VARIABLE}: service {service.name}",
                    "model.config",
                    str(path),
                    "a readable config.json",
                    f"{error}; point model.config at the model's config.json",
                )
            )
    plans: dict[str, Plan] = {}
    for replica_id, request in replica_requests(fleet, placement, configs).items():
        try:
            outcome = plans[replica_id] = plan(request)
        except PlannerUnmodelledError as unmodelled:
            warnings.append(f"{replica_id}: the model's memory was not planned: {unmodelled}")
            continue
        except PlannerInputError as wrong:
            problems.append(
                Problem(
                    f"{VARIABLE}: {replica_id}",
                    "model.config",
                    str(wrong),
                    "a config.json vLLM can load",
                    "point model.config at the model's own config.json",
                )
            )
            continue
        problems += [
            Problem(
                f"{VARIABLE}: {replica_id}",
                "serving (planner)",
                error,
                "a configuration vLLM accepts on this replica's GPUs",
                "see `gpufleet plan -i INVENTORY`",
            )
            for error in outcome.errors
        ]
        warnings += [f"{replica_id}: {warning}" for warning in outcome.warnings]
    return PlannedReplicas(plans, problems, warnings)


def model_config(fleet: FleetSpec, model: ModelSpec) -> Path | None:
    """A model's config.json on the control node: its ``config``, else the bundle's copy; relative paths
    are relative to the inventory."""
    config = model.config
    if config is None and fleet.bundle_dir is not None:
        config = fleet.bundle_dir / "models" / model.repo / "config.json"
    if config is None:
        return None
    return config if config.is_absolute() else fleet.inventory_dir / config


def replica_requests(
    fleet: FleetSpec, placement: Placement, configs: Mapping[str, dict[str, Any]]
) -> dict[str, PlanRequest]:
    """The planner's input for each replica (by id) on its own GPUs, for the services whose config.json is
    in ``configs`` (by service name) and whose GPUs' memory is known."""
    from gpufleet.planner import GpuDevice, PlanRequest  # noqa: PLC0415

    services = {service.name: service for service in services_of(fleet)}
    nodes = {node.name: node for node in fleet.nodes}
    requests: dict[str, PlanRequest] = {}
    for replica in placement.replicas:
        service = services[replica.service]
        devices = _devices(replica, nodes)
        if replica.service not in configs or not devices:
            continue
        requests[replica.id] = PlanRequest(
            hf_config=configs[replica.service],
            gpus=tuple(GpuDevice(name=name, memory_gib=memory) for name, memory in devices),
            **service.serving_of(replica.role).model_dump(exclude={"served_model_name", "port"}),
        )
    return requests


def _devices(replica: Replica, nodes: Mapping[str, Any]) -> list[tuple[str, float]]:
    devices: list[tuple[str, float]] = []
    for member in replica.members:
        node = nodes[member.node]
        memory = gpu_memory_gib(node.gpus)
        if memory is None:
            return []
        devices += [(f"{node.gpus.model or 'GPU'} on {node.name}", memory)] * len(member.gpus)
    return devices
