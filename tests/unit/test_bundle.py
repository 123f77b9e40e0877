"""gpufleet bundle: manifest validation, build (resume, reuse, deterministic lock) and verify."""

from __future__ import annotations

import argparse
import hashlib
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.bundle import BuildError, ManifestError, build, load_manifest, verify
from gpufleet.bundle.fetch import BuildContext, download
from gpufleet.bundle.images import image_id, tar_layer, write_docker_archive
from gpufleet.bundle.lfs import LfsServer, make_lfs_repo
from gpufleet.bundle.lock import LOCK_NAME, sha256_file
from gpufleet.commands import bundle as bundle_command
from gpufleet.lab.tiny_model import write_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2")


def write_manifest(workdir: Path, model_dir: Path, extra: dict[str, Any] | None = None) -> Path:
    """A manifest with a local file, a docker-archive image and the tiny model from a file:// remote."""
    (workdir / "files").mkdir(parents=True, exist_ok=True)
    payload = workdir / "files" / "toolkit.deb"
    payload.write_bytes(b"not really a deb\n" * 100)
    archive = workdir / "files" / "busybox.tar"
    pinned_id = write_docker_archive(archive, "gpufleet/test:1", [tar_layer({"hello.txt": b"hello"})], ["sh"])
    bare, commit = make_lfs_repo(model_dir, workdir / "remote", "gpufleet/tiny-qwen2")
    data: dict[str, Any] = {
        "schema_version": 1,
        "name": "unit",
        "nvidia_container_toolkit": {
            "version": "1.0.0",
            "files": [{"kind": "file", "path": "files/toolkit.deb", "sha256": sha256_file(payload)}],
        },
        "images": [
            {
                "name": "gpufleet/test",
                "tag": "1",
                "id": pinned_id,
                "compression": "gzip",
                "source": {
                    "kind": "docker-archive",
                    "path": "files/busybox.tar",
                    "sha256": sha256_file(archive),
                },
            }
        ],
        "model": {
            "repo": "gpufleet/tiny-qwen2",
            "revision": commit,
            "source": {"kind": "git-lfs", "url": str(bare)},
        },
        **(extra or {}),
    }
    manifest = workdir / "manifest.yml"
    manifest.write_text(yaml.safe_dump(data), encoding="utf-8")
    return manifest


@pytest.fixture
def manifest(tmp_path: Path, tiny_model: Path) -> Path:
    return write_manifest(tmp_path / "src", tiny_model)


@pytest.fixture
def built(tmp_path: Path, manifest: Path) -> Path:
    out = tmp_path / "bundle"
    build(manifest, out)
    return out


@pytest.mark.parametrize("name", ["manifest.yml", "manifest.lab.yml"])
def test_shipped_manifests_validate(name: str) -> None:
    assert load_manifest(REPO / "offline_bundle" / name).schema_version == 1


def test_misspelt_key_names_file_key_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "m.yml"
    path.write_text("schema_version: 1\nname: x\nimagess: []\n")
    with pytest.raises(ManifestError) as error:
        load_manifest(path)
    line = str(error.value)
    assert str(path) in line and "imagess" in line and "Fix: remove the key" in line


def test_bad_sha256_names_the_nested_key(tmp_path: Path) -> None:
    path = tmp_path / "m.yml"
    path.write_text(
        "schema_version: 1\nname: x\ndocker:\n  version: '1'\n  source: {kind: file, path: a, sha256: abc}\n"
    )
    with pytest.raises(ManifestError, match=r"docker\.source\.file\.sha256"):
        load_manifest(path)


def test_build_lays_out_the_bundle_as_the_conventions_say(built: Path, manifest: Path) -> None:
    lock = yaml.safe_load((built / LOCK_NAME).read_text())
    paths = {entry["path"] for entry in lock["files"]}
    assert "nvidia_container_toolkit/1.0.0/toolkit.deb" in paths
    assert "images/gpufleet-test_1.tar.gz" in paths
    assert "models/gpufleet/tiny-qwen2/model.safetensors" in paths
    pinned = yaml.safe_load(manifest.read_text())["images"][0]["id"]  # as write_docker_archive made it
    assert lock["images"][0]["id"] == pinned == image_id(built / "images/gpufleet-test_1.tar.gz")
    assert not (built / "models/gpufleet/tiny-qwen2/.git/lfs/objects").exists(), "weights kept twice"


def test_same_manifest_gives_a_byte_identical_lock(tmp_path: Path, built: Path, manifest: Path) -> None:
    other = tmp_path / "again"
    build(manifest, other)
    assert (other / LOCK_NAME).read_bytes() == (built / LOCK_NAME).read_bytes()


def test_second_build_fetches_nothing(built: Path, manifest: Path) -> None:
    result = build(manifest, built)
    assert result.fetched == []


def test_second_build_refetches_a_corrupted_file(built: Path, manifest: Path) -> None:
    (built / "nvidia_container_toolkit/1.0.0/toolkit.deb").write_bytes(b"x")
    result = build(manifest, built)
    assert result.fetched == ["nvidia_container_toolkit"]
    assert verify(built) == []


def test_a_file_corrupted_without_changing_its_size_is_caught_and_refetched(
    built: Path, manifest: Path
) -> None:
    deb = built / "nvidia_container_toolkit/1.0.0/toolkit.deb"
    good = hashlib.sha256(deb.read_bytes()).hexdigest()
    data = bytearray(deb.read_bytes())
    data[0] ^= 0xFF
    deb.write_bytes(bytes(data))
    bad = hashlib.sha256(bytes(data)).hexdigest()

    assert verify(built) == [
        f"nvidia_container_toolkit/1.0.0/toolkit.deb: corrupt: sha256 {bad[:12]}…, expected {good[:12]}…"
    ]
    assert build(manifest, built).fetched == ["nvidia_container_toolkit"]
    assert hashlib.sha256(deb.read_bytes()).hexdigest() == good
    assert verify(built) == []


def test_verify_of_a_fresh_bundle_is_clean(built: Path) -> None:
    assert verify(built) == []


def test_verify_names_missing_extra_and_corrupt_files(built: Path) -> None:
    (built / "nvidia_container_toolkit/1.0.0/toolkit.deb").unlink()
    (built / "images/stray.tar").write_bytes(b"stray")
    weights = built / "models/gpufleet/tiny-qwen2/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[1000] ^= 0xFF
    weights.write_bytes(bytes(data))
    problems = verify(built)
    assert len(problems) == 3
    assert any(p.startswith("nvidia_container_toolkit/1.0.0/toolkit.deb: missing") for p in problems)
    assert any(p.startswith("images/stray.tar: extra") for p in problems)
    assert any(p.startswith("models/gpufleet/tiny-qwen2/model.safetensors: corrupt") for p in problems)


def test_pinned_image_id_mismatch_fails_the_build(tmp_path: Path, tiny_model: Path) -> None:
    manifest = write_manifest(tmp_path / "src", tiny_model)
    data = yaml.safe_load(manifest.read_text())
    data["images"][0]["id"] = "sha256:" + "1" * 64
    manifest.write_text(yaml.safe_dump(data))
    with pytest.raises(BuildError, match=r"image gpufleet/test:1: image ID .* expected sha256:1111"):
        build(manifest, tmp_path / "bundle")


class _Server:
    """A loopback HTTP file server that honours Range requests (the bundle_lfs server's static side)."""

    def __init__(self, root: Path) -> None:
        self.server = LfsServer(root)

    def __enter__(self) -> LfsServer:
        return self.server.start()

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[LfsServer, Path]]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "blob.bin").write_bytes(bytes(range(256)) * 4096)
    with _Server(root) as server:
        yield server, root / "blob.bin"


def test_download_resumes_a_partial_file_with_a_range_request(
    tmp_path: Path, http_root: tuple[LfsServer, Path]
) -> None:
    server, blob = http_root
    dest = tmp_path / "out" / "blob.bin"
    dest.parent.mkdir()
    dest.with_name("blob.bin.part").write_bytes(blob.read_bytes()[:300_000])
    ctx = BuildContext(out=tmp_path / "out", manifest_dir=tmp_path)
    assert download(ctx, f"{server.url}/blob.bin", dest, sha256_file(blob))
    assert dest.read_bytes() == blob.read_bytes()
    assert ("GET", "/blob.bin", "bytes=300000-") in server.log.requests


def test_download_with_a_wrong_sha256_is_removed_and_named(
    tmp_path: Path, http_root: tuple[LfsServer, Path]
) -> None:
    server, _blob = http_root
    ctx = BuildContext(out=tmp_path, manifest_dir=tmp_path)
    with pytest.raises(BuildError, match=r"blob\.bin: sha256 .* expected 0000"):
        download(ctx, f"{server.url}/blob.bin", tmp_path / "blob.bin", "0" * 64)
    assert not (tmp_path / "blob.bin").exists()


def test_unpinned_download_is_refused_without_trust(
    tmp_path: Path, http_root: tuple[LfsServer, Path]
) -> None:
    server, _blob = http_root
    ctx = BuildContext(out=tmp_path, manifest_dir=tmp_path)
    with pytest.raises(BuildError, match="no sha256 pinned"):
        download(ctx, f"{server.url}/blob.bin", tmp_path / "blob.bin", None)


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet")
    bundle_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code: int = args.func(args)
    return code


def test_cli_verify_exits_1_and_prints_one_line_per_problem(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (built / "extra.txt").write_text("x")
    assert _cli("bundle", "verify", str(built)) == 1
    assert capsys.readouterr().out.splitlines() == ["extra.txt: extra: not in bundle.lock.yml"]


def test_cli_verify_of_a_good_bundle_exits_0(built: Path) -> None:
    assert _cli("bundle", "verify", str(built)) == 0


def test_cli_build_with_a_bad_manifest_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "m.yml"
    bad.write_text("schema_version: 2\nname: x\n")
    assert _cli("bundle", "build", "--manifest", str(bad), "--out", str(tmp_path / "b")) == 2
    assert "schema_version" in capsys.readouterr().err


def test_cli_verify_without_a_lock_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("bundle", "verify", str(tmp_path)) == 1
    assert "bundle.lock.yml: missing" in capsys.readouterr().err


def test_lock_is_sorted_and_has_no_timestamps(built: Path) -> None:
    text = (built / LOCK_NAME).read_text()
    paths = [entry["path"] for entry in yaml.safe_load(text)["files"]]
    assert paths == sorted(paths)
    assert "date" not in text.lower() and "time" not in text.lower()


def test_a_stopped_server_leaves_no_thread_and_no_listening_socket(tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hello\n")
    before = set(threading.enumerate())
    with LfsServer(tmp_path) as server:
        (thread,) = [thread for thread in threading.enumerate() if thread not in before]
        with urllib.request.urlopen(f"{server.url}/hello.txt", timeout=10) as response:
            assert response.read() == b"hello\n"
        host, port = server.server_address[:2]
    thread.join(timeout=10)
    assert thread.name == "lfs-server" and not thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((str(host), int(port)), timeout=5).close()


def test_docker_binaries_are_executables_not_same_named_config_files(tmp_path: Path) -> None:
    from gpufleet.bundle.debian import DOCKER_BINARIES, find_binaries

    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/docker").write_text("# sourced by the init script\n")
    (tmp_path / "etc/init.d").mkdir(parents=True)
    (tmp_path / "etc/init.d/docker").write_text("#!/bin/sh\n")
    (tmp_path / "etc/init.d/docker").chmod(0o755)
    (tmp_path / "usr/bin").mkdir(parents=True)
    cli = tmp_path / "usr/bin/docker"
    cli.write_bytes(b"\x7fELF docker cli")
    cli.chmod(0o755)

    assert find_binaries(tmp_path, DOCKER_BINARIES) == {"docker": b"\x7fELF docker cli"}


def test_the_gateways_router_wheel_lands_under_gateway_with_its_version(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The manifest's gateway: section (roles/gateway reads the wheel from the lock under gateway/)."""
    wheel = tmp_path / "src" / "files" / "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"a wheel stand-in\n" * 64)
    source = {"kind": "file", "path": f"files/{wheel.name}", "sha256": sha256_file(wheel)}
    extra = {"gateway": {"router": {"version": "0.1.17", "source": source}}}
    out = tmp_path / "bundle"
    build(write_manifest(tmp_path / "src", tiny_model, extra), out)
    lock = yaml.safe_load((out / LOCK_NAME).read_text())
    (entry,) = [entry for entry in lock["files"] if entry["path"].startswith("gateway/")]
    assert (entry["path"], entry["version"], entry["sha256"]) == (
        f"gateway/{wheel.name}",
        "0.1.17",
        source["sha256"],
    )
