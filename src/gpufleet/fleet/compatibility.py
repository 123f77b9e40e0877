"""The fleet's driver, CUDA toolkit, image, executor and GPUs checked together (:mod:`gpufleet.compat`).

Values come from the inventory, else from the roles' defaults; the image's facts from the bundle's lock
when the fleet deploys from a bundle (read from the image itself when it was built), else from the pinned
table of vLLM releases. Hosts without GPUs (``gpufleet_gpu: false``, the lab) are not judged on CUDA, and
their fleet is not planned, so neither is the image's vLLM release compared with the planner's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.compat import (
    ImageFacts,
    check_driver_toolkit,
    check_executor,
    check_image,
    check_vllm_version,
    image_facts,
)
from gpufleet.fleet.raw import RawInventory
from gpufleet.fleet.role_values import ansible_bool, role_defaults
from gpufleet.fleet.schema import FleetSpec
from gpufleet.paths import project_root
from gpufleet.planner.vllm_archs import VLLM_VERSION
from gpufleet.problems import Problem

# Inventory variable -> the role whose defaults hold its value when the inventory does not set it.
DEFAULTS_FROM = {
    "nvidia_driver_version": "nvidia_driver",
    "cuda_toolkit_version": "cuda_toolkit",
    "ray_cluster_image": "ray_cluster",
    "vllm_service_executor": "vllm_service",
    "ray_cluster_start_ray": "ray_cluster",
}


@dataclass(frozen=True)
class Compatibility:
    problems: list[Problem]
    warnings: list[str]
    executor: str | None  # the executor `auto` resolves to


def check_compatibility(fleet: FleetSpec, variables: Mapping[str, Any], root: Path | None) -> Compatibility:
    """Every mismatch between the fleet's driver, toolkit, image, executor and GPUs."""
    value = _values(variables, root)
    image = image_of(fleet, str(value["ray_cluster_image"]))
    executor, findings = check_executor(
        str(value.get("vllm_service_executor") or "auto"), image, value.get("ray_cluster_start_ray", "auto")
    )
    gpus = [(node.name, node.gpus.model or "") for node in fleet.nodes if node.gpu and node.gpus.count]
    if gpus and value.get("nvidia_driver_version"):
        driver = str(value["nvidia_driver_version"])
        forward_compat = ansible_bool(variables.get("gpufleet_cuda_forward_compat"), default=False)
        findings += check_image(image, driver, gpus, forward_compat=forward_compat)
        if value.get("cuda_toolkit_version"):
            findings += check_driver_toolkit(driver, str(value["cuda_toolkit_version"]))
    problems = [
        Problem("group gpu_nodes", f.variable, f.found, f.expected, f.fix) for f in findings if f.error
    ]
    warnings = [f"{f.variable}: {f.found}; {f.expected}. {f.fix}" for f in findings if not f.error]
    if gpus:  # the fleet gets a memory plan (validation plans GPU nodes only)
        warnings += vllm_version_warnings(image)
    own = _service_images(fleet, variables, str(value.get("nvidia_driver_version") or ""), gpus)
    return Compatibility(problems + own.problems, warnings + own.warnings, executor)


def _service_images(
    fleet: FleetSpec, variables: Mapping[str, Any], driver: str, gpus: list[tuple[str, str]]
) -> Compatibility:
    """A service's own image (``gpufleet_services[].image``) judged as the fleet's is, against every GPU."""
    problems: list[Problem] = []
    warnings: list[str] = []
    forward_compat = ansible_bool(variables.get("gpufleet_cuda_forward_compat"), default=False)
    for service in fleet.services:
        if service.image is None or not gpus:
            continue
        image = image_of(fleet, service.image)
        where = f"gpufleet_services ({service.name})"
        for f in check_image(image, driver, gpus, forward_compat=forward_compat) if driver else []:
            variable = "image" if f.variable == "ray_cluster_image" else f.variable
            if f.error:
                problems.append(Problem(where, variable, f.found, f.expected, f.fix))
            else:
                warnings.append(f"{where}: {variable}: {f.found}; {f.expected}. {f.fix}")
        warnings += [f"{where}: {line}" for line in vllm_version_warnings(image)]
    return Compatibility(problems, warnings, None)


def fleet_image(fleet: FleetSpec, variables: Mapping[str, Any], root: Path | None) -> ImageFacts:
    """The facts of the image the fleet runs (``ray_cluster_image``, else the role's default)."""
    name = "ray_cluster_image"
    return image_of(
        fleet, str(variables[name] if name in variables else role_defaults(root, "ray_cluster").get(name))
    )


def fleet_vllm_version_warnings(
    spec: FleetSpec, raw: RawInventory, overrides: Mapping[str, Any] | None = None
) -> list[str]:
    """:func:`vllm_version_warnings` for a validated fleet with GPUs (one without is not planned), from its
    head's variables (the image is one fleet-wide setting) and ``overrides`` (a run's extra variables)."""
    if not any(node.gpu and node.gpus.count for node in spec.nodes):
        return []
    head = next(iter(raw.members("ray_head")), None)
    variables = {**(head.variables if head is not None else {}), **(overrides or {})}
    return vllm_version_warnings(fleet_image(spec, variables, project_root()))


def image_of(fleet: FleetSpec, reference: str) -> ImageFacts:
    """The facts of image ``reference``: the bundle lock's where it records them, else gpufleet.compat's."""
    return image_facts(reference, _from_bundle(fleet, reference))


def vllm_version_warnings(image: ImageFacts) -> list[str]:
    """One line when the image's vLLM release differs from the planner's (``gpufleet plan`` says it too)."""
    return [
        str(Problem("group gpu_nodes", f.variable, f.found, f.expected, f.fix))
        for f in check_vllm_version(image, VLLM_VERSION)
    ]


def _values(variables: Mapping[str, Any], root: Path | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, role in DEFAULTS_FROM.items():
        values[name] = variables[name] if name in variables else role_defaults(root, role).get(name)
    return values


def _from_bundle(fleet: FleetSpec, reference: str) -> ImageFacts | None:
    """The image's facts as the bundle's lock recorded them (read from the image at build time)."""
    if fleet.bundle_dir is None:
        return None
    from gpufleet.bundle.lock import LockError, read_lock  # noqa: PLC0415  (only with a bundle)

    bundle = fleet.bundle_dir
    if not bundle.is_absolute():
        bundle = fleet.inventory_dir / bundle
    try:
        lock = read_lock(bundle)
    except LockError:
        return None  # the artifacts stage says what is wrong with the bundle
    for image in lock.images:
        read = any(getattr(image, name) is not None for name in ("cuda", "vllm", "ray", "torch", "python"))
        if f"{image.name}:{image.tag}" == reference and read:  # a lock from before gpufleet read images
            return ImageFacts(
                reference, image.cuda, image.ray is not None, image.vllm, image.ray, image.python,
                torch=image.torch, source="image config",
            )  # fmt: skip
    return None
