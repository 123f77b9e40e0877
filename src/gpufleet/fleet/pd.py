"""Checks of a P/D service (``gpufleet_services[].pd``, issue 39) that its schema cannot make alone: whether
the image its replicas run can move the KV cache, and the settings measured to matter on the GPU machine.

The schema (:class:`gpufleet.fleet.schema.PdSpec`) already refuses what cannot work in itself: a connector
other than NixlConnector (the one vllm-router's P/D mode reaches by URL), ``replicas`` or ``hosts`` beside
``pd``, and a setting both roles must share (block size, KV-cache dtype, dtype, context length, the name
clients send) set on one role. Placement names a role that does not fit (``service NAME (decode)``) and
gives each replica its NIXL side-channel ports, one per TP rank, apart from the other replicas' side
channels on its node; what placement does not check is here: those ports in 1-65535, and none a replica's
API port on that node.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.compat import ImageFacts
from gpufleet.fleet.compatibility import fleet_image, image_of
from gpufleet.fleet.schema import FleetSpec, ServiceSpec
from gpufleet.fleet.services import place_fleet
from gpufleet.planner.placement import PlacementError
from gpufleet.problems import Problem

VARIABLE = "gpufleet_services"
LAB_IMAGE = "gpufleet/vllm-cpu:"  # the lab's CPU build of vLLM: no NIXL, no GPU


def pd_problems(
    fleet: FleetSpec, head_variables: Mapping[str, Any], root: Path | None
) -> tuple[list[Problem], list[str]]:
    """What keeps each P/D service of ``fleet`` from moving its KV cache (problems), and what is slow or test
    only (warnings). A service without its own image runs the fleet's (the head's ray_cluster_image, else the
    role's default: compatibility.fleet_image)."""
    problems: list[Problem] = []
    warnings: list[str] = []
    for service in fleet.services:
        if service.pd is None:
            continue
        where = f"{VARIABLE}: service {service.name}"
        if not service.pd.kv_transfer:
            warnings.append(
                f"service {service.name}: pd.kv_transfer is false: KV transfer is OFF (test only). Its "
                "router sends each request to a prefill and then a decode replica, but decode computes the "
                "prompt again; not for production"
            )
            continue
        image = image_of(fleet, service.image) if service.image else fleet_image(fleet, head_variables, root)
        field = "image" if service.image else "ray_cluster_image"
        problem = _image_problem(service, where, field, image)
        if isinstance(problem, Problem):
            problems.append(problem)
        elif problem:
            warnings.append(problem)
        if service.serving.block_size == 16:
            warnings.append(
                f"service {service.name}: serving.block_size 16 with pd: NIXL moves the KV cache one block "
                "per descriptor, and on an H100 1P1D at block 16 reached half a plain instance's "
                "requests/s, at 128 the same (tests/gpu/README.md, 'P/D through vllm-router'); set "
                "serving.block_size: 128"
            )
    return problems + side_channel_problems(fleet), warnings


def side_channel_problems(fleet: FleetSpec) -> list[Problem]:
    """Each P/D replica's NIXL side-channel ports (with KV transfer on): at most 65535, none a replica's API
    port on its node. One line per service and kind; nothing when the services cannot be placed (validation
    says why elsewhere)."""
    try:
        placement = place_fleet(fleet)
    except PlacementError:
        return []
    services = {service.name: service for service in fleet.services}
    api = {(replica.node, replica.port): replica.id for replica in placement.replicas}
    found: dict[tuple[str, str], Problem] = {}
    for replica in placement.replicas:
        service = services[replica.service]
        if replica.side_channel_port is None or service.pd is None or not service.pd.kv_transfer:
            continue
        first = replica.side_channel_port
        ports = range(first, first + service.serving_of(replica.role).tensor_parallel_size)
        where = f"{VARIABLE}: service {service.name} ({replica.role})"
        if ports[-1] > 65535:
            said = f"ports {first}-{ports[-1]}" if len(ports) > 1 else f"port {first}"
            found.setdefault(
                (service.name, "range"),
                Problem(
                    where,
                    "pd.side_channel_port",
                    f"{said} for {replica.id} on {replica.node} (one per replica and TP rank)",
                    "ports from 1 to 65535, the ones derived from it included",
                    f"set pd.side_channel_port at most {service.pd.side_channel_port - (ports[-1] - 65535)}",
                ),
            )
        taken = next((port for port in ports if (replica.node, port) in api), None)
        if taken is not None:
            found.setdefault(
                (service.name, "api"),
                Problem(
                    where,
                    "pd.side_channel_port",
                    f"port {taken} for {replica.id} on {replica.node}, "
                    f"the API port of {api[(replica.node, taken)]}",
                    "side-channel ports apart from the replicas' API ports on each node",
                    "set pd.side_channel_port below the replicas' ports "
                    "(8100 and up unless a service sets its port)",
                ),
            )
    return list(found.values())


def _image_problem(service: ServiceSpec, where: str, field: str, facts: ImageFacts) -> Problem | str | None:
    """A problem when the image cannot move the KV cache, a warning when that is not known, else None."""
    reference = facts.reference
    if reference.startswith(LAB_IMAGE):
        return Problem(
            where,
            f"{field} / pd.kv_transfer",
            f"{reference} (vLLM's CPU build: no NIXL) with KV transfer on",
            "an image whose vLLM can move the KV cache between GPUs (NIXL)",
            "serve a CUDA vLLM image with NIXL (vllm/vllm-openai); in the lab only, set "
            "pd.kv_transfer: false",
        )
    if facts.has_nixl is False:
        return Problem(
            where,
            field,
            f"{reference}, which has no NIXL (the `nixl` Python package, with UCX)",
            "an image with NIXL for pd.connector NixlConnector",
            "serve an image built with NIXL (vLLM's Dockerfile: INSTALL_KV_CONNECTORS=true; vllm/vllm-openai "
            "has it)",
        )
    if facts.has_nixl is None:
        return (
            f"service {service.name}: whether {reference} has NIXL (the `nixl` package, with UCX) is not "
            "known; the P/D replicas need it. Check with `docker run --rm IMAGE python3 -c 'import nixl'`"
        )
    return None
