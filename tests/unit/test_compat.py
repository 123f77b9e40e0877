"""Driver ↔ CUDA ↔ image ↔ GPU: every row of the README's "Versions" table, and the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gpufleet.compat import (
    CUDA_MIN_DRIVER,
    ImageFacts,
    check_driver_toolkit,
    check_executor,
    check_image,
    cuda_from_requirement,
    driver_branch_for,
    driver_cuda,
    gpu_capability,
    image_facts,
)
from gpufleet.fleet import validate_inventory

REPO = Path(__file__).resolve().parents[2]
SEED = [("gpu-head-01", "NVIDIA GeForce RTX 3090"), ("gpu-worker-01", "NVIDIA H800")]
H800 = [("gpu-worker-01", "NVIDIA H800")]
V0101 = image_facts("vllm/vllm-openai:v0.10.1.1")
V085 = image_facts("vllm/vllm-openai:v0.8.5")
V0240 = image_facts("vllm/vllm-openai:v0.24.0")  # the default (roles/ray_cluster, inventories/prod)

# The README's table: driver, toolkit, image, GPUs, forward compat, accepted?
ROWS = [
    ("580.95.05", "12.4", V0240, SEED, False, True),  # the default of inventories/prod
    ("570.172.08", "12.4", V0240, SEED, False, False),  # the 570 branch runs CUDA 12.8, the image needs 13.0
    ("570.172.08", "12.4", V0240, H800, True, True),  # ... a datacenter GPU with cuda-compat runs it
    ("570.172.08", "12.4", V0101, SEED, False, True),  # the default before v0.24.0
    ("580.65.06", "12.4", V0101, SEED, False, True),
    ("550.163.01", "12.4", V085, SEED, False, True),
    ("550.163.01", "12.4", V0101, SEED, False, False),  # the old default pair
    ("550.163.01", "12.4", V0101, H800, True, True),  # datacenter GPU + cuda-compat: accepted, with a warning
    ("550.163.01", "12.4", V0101, SEED, True, False),  # ... but not with a GeForce in the fleet
    ("535.247.01", "12.4", V085, H800, False, False),  # CUDA 12.4 toolkit needs 550.54.14
]


@pytest.mark.parametrize("row", ROWS)
def test_versions_table(row: tuple[str, str, ImageFacts, list[tuple[str, str]], bool, bool]) -> None:
    driver, toolkit, image, gpus, compat, accepted = row
    findings = check_image(image, driver, gpus, forward_compat=compat) + check_driver_toolkit(driver, toolkit)
    errors = [finding for finding in findings if finding.error]
    assert (not errors) is accepted, errors


def test_the_default_image_row_is_the_images_own_metadata() -> None:
    """vllm/vllm-openai:v0.24.0, pinned to what its sources say (checked 2026-12-02):

    - CUDA 13.0: vLLM's unsuffixed image tags and wheels are CUDA 13.0 builds since v0.20.0, the `-cu129`
      tags CUDA 12.9 (vllm-project/vllm#39878, "Switch default CUDA to 13.0 ... aligns with torch 2.11");
      docker/Dockerfile builds FROM nvidia/cuda:${CUDA_VERSION}-base (ARG CUDA_VERSION=13.0.x on main after
      it), whose NVIDIA_REQUIRE_CUDA is cuda>=13.0. The PyPI wheel vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64
      (sha256 2d2831ae...22cf, commit gee0da84ab) agrees: vllm/envs.py VLLM_MAIN_CUDA_VERSION = "13.0", its
      _C_stable_libtorch.abi3.so needs libcudart.so.13, and it requires nvidia-cutlass-dsl[cu13].
    - torch 2.11.0: that wheel's METADATA, Requires-Dist: torch==2.11.0 (2.11.0+cu130 on the GPU machine,
      tests/gpu/README.md).
    - no Ray: the wheel's METADATA requires no ray (extras included).
    - compute capability 7.5 or newer: CUDA 13.0 builds no Volta (7.0) code; the Dockerfile's
      torch_cuda_arch_list starts at 7.5.
    - the driver: CUDA 13.0 needs the 580 branch, at least 580.65.06 (NVIDIA's CUDA 13.0 GA release notes).
    """
    assert (V0240.cuda, V0240.has_ray, V0240.vllm, V0240.torch) == ("13.0", False, "0.24.0", "2.11.0")
    assert V0240.min_capability == (7, 5) and V0240.source == "table"
    assert driver_branch_for("13.0") == "580" and CUDA_MIN_DRIVER["13.0"] == "580.65.06"
    (refused,) = check_image(V0240, "570.172.08", SEED)
    assert "CUDA 13.0" in refused.found and "580" in refused.fix


def test_the_old_default_pair_is_refused_naming_driver_image_gpu_and_fix() -> None:
    (finding,) = check_image(V0101, "550.163.01", SEED)
    line = f"{finding.variable}: found {finding.found}; expected {finding.expected}. Fix: {finding.fix}"
    for needed in ("550.163.01", "vllm/vllm-openai:v0.10.1.1", "CUDA 12.8", "RTX 3090", "570"):
        assert needed in line, (needed, line)


def test_forward_compat_on_datacenter_gpus_is_accepted_with_a_warning_not_silently() -> None:
    (finding,) = check_image(V0101, "550.163.01", H800, forward_compat=True)
    assert not finding.error and finding.variable == "gpufleet_cuda_forward_compat"


def test_a_too_old_gpu_is_refused() -> None:
    image = ImageFacts("vllm/vllm-openai:vX", "12.4", True, min_capability=(8, 0))
    (finding,) = check_image(image, "550.163.01", [("old", "Tesla V100-SXM2-32GB")])
    assert finding.error and "7.0" in finding.found


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [("550.163.01", "12.4"), ("570.172.08", "12.8"), ("580.95.05", "13.0"), ("999.1", None)],
)
def test_driver_branch_to_cuda(driver: str, cuda: str | None) -> None:
    assert driver_cuda(driver) == cuda


@pytest.mark.parametrize(
    ("text", "cuda"),
    [
        ("cuda>=12.8 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471", "12.8"),
        ("12.4.1", "12.4"),
        ("", None),
    ],
)
def test_cuda_from_the_image_requirement(text: str, cuda: str | None) -> None:
    assert cuda_from_requirement(text) == cuda


@pytest.mark.parametrize(
    ("name", "capability"),
    [
        ("NVIDIA GeForce RTX 3090", (8, 6)),
        ("NVIDIA H800", (9, 0)),
        ("NVIDIA H100 80GB HBM3", (9, 0)),
        ("NVIDIA L40S", (8, 9)),  # not L40's
        ("NVIDIA A10", (8, 6)),  # not A100's
        ("Some Future GPU", None),
    ],
)
def test_gpu_capability(name: str, capability: tuple[int, int] | None) -> None:
    assert gpu_capability(name) == capability


def test_executor_auto_follows_the_image_and_ray_without_ray_is_refused() -> None:
    no_ray = V0240
    assert check_executor("auto", V0101) == ("ray", [])
    assert check_executor("auto", no_ray) == ("mp", [])
    _, findings = check_executor("ray", no_ray)
    assert findings and findings[0].variable == "vllm_service_executor" and "auto or mp" in findings[0].fix


def test_ray_cluster_start_ray_false_means_mp_and_refuses_the_ray_executor() -> None:
    assert check_executor("auto", V0101, start_ray=False) == ("mp", [])
    assert check_executor("auto", V0101, start_ray="auto") == ("ray", [])
    _, findings = check_executor("ray", V0101, start_ray="false")
    assert findings and "ray_cluster_start_ray is false" in findings[0].found
    assert "ray_cluster_start_ray to auto" in findings[0].fix
    assert check_executor("ray", V0101, start_ray=True) == ("ray", [])


def tp_copy(tmp_path: Path, **variables: object) -> Path:
    """A copy of the one-model example (inventories/prod's servers and versions, one TP=2 instance) with
    ``variables`` set for the whole fleet."""
    inventory = tmp_path / "tp-across-nodes"
    shutil.copytree(REPO / "inventories" / "examples" / "tp-across-nodes", inventory)
    group_vars = inventory / "group_vars" / "gpu_nodes.yml"
    data = yaml.safe_load(group_vars.read_text())
    data["gpufleet_model_config"] = str(REPO / "models" / "Qwen2.5-1.5B-Instruct" / "config.json")
    data.update(variables)
    group_vars.write_text(yaml.safe_dump(data))
    return inventory


def test_validate_accepts_the_prod_defaults(tmp_path: Path) -> None:
    assert validate_inventory(REPO / "inventories" / "prod").problems == []  # services
    result = validate_inventory(tp_copy(tmp_path))  # the same versions, one instance over both servers
    assert result.problems == []


def test_validate_refuses_the_old_pair_in_one_line(tmp_path: Path) -> None:
    result = validate_inventory(tp_copy(tmp_path, nvidia_driver_version="550.163.01"))
    (problem,) = result.problems
    assert problem.variable == "ray_cluster_image"
    assert "550.163.01" in str(problem) and "RTX 3090" in str(problem) and "\n" not in str(problem)


def test_validate_refuses_the_ray_executor_without_ray_started(tmp_path: Path) -> None:
    inventory = tp_copy(tmp_path, vllm_service_executor="ray", ray_cluster_start_ray=False)
    (problem,) = validate_inventory(inventory).problems
    assert problem.variable == "vllm_service_executor" and "ray_cluster_start_ray is false" in str(problem)


def test_image_contents_are_read_from_the_image_itself(tmp_path: Path) -> None:
    """What the compatibility check needs: CUDA from NVIDIA_REQUIRE_CUDA (over CUDA_VERSION), Ray, vLLM."""
    from gpufleet.bundle.images import image_contents, tar_layer, write_docker_archive

    site = "usr/local/lib/python3.12/dist-packages"
    layers = [
        tar_layer({"etc/os-release": b"ID=ubuntu\n"}),
        tar_layer(
            {f"{site}/vllm-0.10.1.1.dist-info/METADATA": b"", f"{site}/ray-2.48.0.dist-info/METADATA": b""}
        ),
    ]
    archive = tmp_path / "image.tar"
    write_docker_archive(
        archive, "vllm/vllm-openai:v0.10.1.1", layers, ["vllm"],
        env=("CUDA_VERSION=12.8.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=470,driver<471"),
    )  # fmt: skip
    found = image_contents(archive)
    assert found == {"cuda": "12.8", "vllm": "0.10.1.1", "ray": "2.48.0", "torch": None, "python": "3.12"}

    bare = tmp_path / "bare.tar"
    write_docker_archive(bare, "x:1", [layers[0]], ["sh"], env=("CUDA_VERSION=12.4.1",))
    assert image_contents(bare) == {"cuda": "12.4", "vllm": None, "ray": None, "torch": None, "python": None}
