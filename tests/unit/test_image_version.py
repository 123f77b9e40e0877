"""The image's vLLM release against the planner's: the default image agrees, and a different one is a warning
(never a refusal) in ``gpufleet plan``, ``validate`` and ``deploy``, whichever way the version is known."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.commands import deploy as deploy_command
from gpufleet.commands import plan as plan_command
from gpufleet.commands.deploy import image_caveats
from gpufleet.compat import ImageFacts, check_vllm_version, image_facts, image_vllm_version, release
from gpufleet.fleet import load, validate_inventory
from gpufleet.planner.vllm_archs import VLLM_VERSION
from gpufleet.runner import DeployReport

from .test_compat import tp_copy

REPO = Path(__file__).resolve().parents[2]
OLD = "vllm/vllm-openai:v0.10.1.1"


def role_default(role: str, name: str) -> str:
    return str(yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())[name])


def version_warnings(warnings: list[str]) -> list[str]:
    return [warning for warning in warnings if "the release gpufleet plan predicts" in warning]


# --- the default image, everywhere it is named, is the planner's release


def test_the_default_image_runs_the_vllm_release_the_planner_predicts() -> None:
    default = role_default("ray_cluster", "ray_cluster_image")
    assert image_vllm_version(image_facts(default)) == (VLLM_VERSION, "gpufleet's table of vLLM images")
    assert check_vllm_version(image_facts(default), VLLM_VERSION) == []


def test_prod_inventory_and_offline_bundle_name_the_default_image() -> None:
    default = role_default("ray_cluster", "ray_cluster_image")
    prod = yaml.safe_load((REPO / "inventories" / "prod" / "group_vars" / "gpu_nodes.yml").read_text())
    manifest = yaml.safe_load((REPO / "offline_bundle" / "manifest.yml").read_text())
    bundled = [f"{image['name']}:{image['tag']}" for image in manifest["images"] if "vllm" in image["name"]]
    assert prod["ray_cluster_image"] == default
    assert bundled == [default]


# --- where the image's vLLM version comes from


@pytest.mark.parametrize(
    ("image", "found"),
    [
        (image_facts(OLD), ("0.10.1.1", "gpufleet's table of vLLM images")),
        (image_facts("gpufleet/vllm-cpu:0.32.0"), ("0.32.0", "its tag")),
        (image_facts("registry.local:5000/vllm/vllm-openai:v0.25.1-cu129"), ("0.25.1", "its tag")),
        (image_facts("vllm/vllm-openai:latest"), None),
        (image_facts("example.org/team/server:1.2.3"), None),  # a tag of another image says nothing of vLLM
        # the bundle's lock (read from the image) wins over the tag: a re-tagged image
        (
            ImageFacts("vllm/vllm-openai:v0.24.0", "13.0", False, vllm="0.32.0+cpu", source="image config"),
            ("0.32.0", "the bundle's lock, read from the image"),
        ),
    ],
)
def test_image_vllm_version(image: ImageFacts, found: tuple[str, str] | None) -> None:
    assert image_vllm_version(image) == found


@pytest.mark.parametrize(
    ("version", "expected"), [("0.24.0", "0.24.0"), ("v0.24.0", "0.24.0"), ("0.32.0+cpu", "0.32.0"),
                              ("0.24.0.post1", "0.24.0"), ("0.10.1.1", "0.10.1"), ("latest", None)],
)  # fmt: skip
def test_release(version: str, expected: str | None) -> None:
    assert release(version) == expected


def test_another_release_is_a_warning_naming_both_versions_what_differs_and_the_fix() -> None:
    (finding,) = check_vllm_version(image_facts("gpufleet/vllm-cpu:0.32.0"), "0.24.0")
    assert not finding.error and finding.variable == "ray_cluster_image"
    line = f"found {finding.found}; expected {finding.expected}. Fix: {finding.fix}"
    for needed in ("vLLM 0.32.0", "vLLM 0.24.0", "KV-cache", "vllm/vllm-openai:v0.24.0", "approximate"):
        assert needed in line, (needed, line)


def test_a_post_release_of_the_planned_version_is_the_same_release() -> None:
    read = ImageFacts("vllm/vllm-openai:v0.24.0", "13.0", False, vllm="0.24.0.post1", source="image config")
    assert image_vllm_version(read) == ("0.24.0.post1", "the bundle's lock, read from the image")
    assert check_vllm_version(read, "0.24.0") == []


# --- gpufleet validate (and the preflight stage, which calls it)


def test_validate_warns_but_accepts_an_image_of_another_vllm(tmp_path: Path) -> None:
    result = validate_inventory(tp_copy(tmp_path, ray_cluster_image=OLD))
    assert result.problems == []
    (warning,) = version_warnings(result.warnings)
    assert warning.startswith("group gpu_nodes: ray_cluster_image: found vllm/vllm-openai:v0.10.1.1, which ")
    assert f"vLLM {VLLM_VERSION}" in warning and "vLLM 0.10.1.1" in warning and "\n" not in warning


def test_validate_of_the_prod_defaults_has_no_version_warning(tmp_path: Path) -> None:
    assert version_warnings(validate_inventory(tp_copy(tmp_path)).warnings) == []


def bundle_holding(tmp_path: Path, vllm: str) -> Path:
    """A bundle whose lock says the v0.24.0-tagged image holds ``vllm`` (a build reads it from the image)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    image = {
        "name": "vllm/vllm-openai", "tag": "v0.24.0", "id": "sha256:" + "a" * 64,
        "path": "images/vllm.tar.zst", "compression": "zstd", "cuda": "13.0", "vllm": vllm,
        "ray": None, "torch": "2.11.0", "python": "3.12",
    }  # fmt: skip
    lock = {"schema_version": 1, "manifest": "manifest.yml", "files": [], "images": [image]}
    (bundle / "bundle.lock.yml").write_text(yaml.safe_dump(lock))
    return bundle


def test_validate_takes_the_version_from_the_bundle_lock(tmp_path: Path) -> None:
    """The lock records what the bundle build read from the image: it overrides what the tag says."""
    bundle = bundle_holding(tmp_path, "0.23.1")
    tagged = "vllm/vllm-openai:v0.24.0"
    inventory = tp_copy(tmp_path, gpufleet_bundle_dir=str(bundle), ray_cluster_image=tagged)
    result = validate_inventory(inventory)
    assert result.problems == []
    (warning,) = version_warnings(result.warnings)
    assert "vLLM 0.23.1 (the bundle's lock, read from the image)" in warning


def test_a_fleet_without_gpus_is_not_planned_so_not_compared(tmp_path: Path) -> None:
    """The lab: its CPU image (vLLM 0.32) serves a fleet that gets no memory plan, so there is no caveat."""
    inventory = tp_copy(tmp_path, ray_cluster_image="gpufleet/vllm-cpu:0.32.0", gpufleet_gpu=False)
    assert version_warnings(validate_inventory(inventory).warnings) == []


# --- gpufleet plan -i


PlanJson = Callable[..., tuple[int, dict[str, Any]]]


@pytest.fixture
def plan_json(capsys: pytest.CaptureFixture[str]) -> PlanJson:
    """``gpufleet plan ARGS --json``: its exit code and the object it printed."""
    parser = argparse.ArgumentParser(prog="gpufleet")
    plan_command.register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> tuple[int, dict[str, Any]]:
        args = parser.parse_args(["plan", *argv, "--json"])
        code: int = args.func(args)
        return code, json.loads(capsys.readouterr().out)

    return run


@pytest.mark.slow
def test_plan_names_its_version_and_warns_on_an_image_of_another(tmp_path: Path, plan_json: PlanJson) -> None:
    code, data = plan_json("-i", str(tp_copy(tmp_path, ray_cluster_image="gpufleet/vllm-cpu:0.32.0")))
    assert code == 0 and data["errors"] == []
    assert data["vllm_version"] == VLLM_VERSION
    (warning,) = version_warnings(data["warnings"])
    assert "gpufleet/vllm-cpu:0.32.0, which runs vLLM 0.32.0 (its tag)" in warning


# --- gpufleet deploy: the same warning in its report, for the image the run deployed


def test_deploy_warns_for_the_image_given_on_its_command_line(tmp_path: Path) -> None:
    fleet = load(tp_copy(tmp_path))
    assert image_caveats(fleet, {}, None) == []
    (warning,) = image_caveats(fleet, {"ray_cluster_image": OLD}, None)
    assert warning.startswith("group gpu_nodes: ray_cluster_image: found vllm/vllm-openai:v0.10.1.1, which ")


def test_deploy_reads_the_version_from_its_bundle(tmp_path: Path) -> None:
    (warning,) = image_caveats(load(tp_copy(tmp_path)), {}, bundle_holding(tmp_path, "0.23.1"))
    assert "vLLM 0.23.1 (the bundle's lock, read from the image)" in warning


def test_deploy_adds_no_caveat_for_a_fleet_without_gpus_or_an_unreadable_inventory(tmp_path: Path) -> None:
    lab_like = tp_copy(tmp_path, ray_cluster_image="gpufleet/vllm-cpu:0.32.0", gpufleet_gpu=False)
    assert image_caveats(load(lab_like), {}, None) == []
    assert image_caveats(load(tmp_path / "missing"), {"ray_cluster_image": OLD}, None) == []


def test_deploys_report_carries_the_warning_after_its_own(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="gpufleet")
    deploy_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["deploy", "-i", str(tp_copy(tmp_path)), "-e", f"ray_cluster_image={OLD}"])
    report = DeployReport(ok=True, warnings=("a stale marker was taken over",))
    report = deploy_command.finished(report, load(args.inventory), args)
    assert report.ok and report.warnings[0] == "a stale marker was taken over"
    (warning,) = version_warnings(list(report.warnings[1:]))
    assert "vLLM 0.10.1.1" in warning and f"vLLM {VLLM_VERSION}" in warning
