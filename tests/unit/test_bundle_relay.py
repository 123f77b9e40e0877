"""The chain relay that image_distribution and model_fetch run on nodes, exercised on loopback."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

RELAY = Path(__file__).resolve().parents[2] / "roles/image_distribution/files/gpufleet_relay.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def receiver(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(RELAY), "recv", "--timeout", "20", *args], stdout=subprocess.PIPE, text=True
    )


def send(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RELAY), "send", "--to", f"127.0.0.1:{port}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def payload(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "src.bin"
    path.write_bytes(os.urandom(3_000_000))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_chain_of_three_delivers_identical_files(tmp_path: Path, payload: tuple[Path, str]) -> None:
    src, digest = payload
    ports = [free_port() for _ in range(3)]
    procs = []
    for index in reversed(range(3)):
        nxt = ["--next", f"127.0.0.1:{ports[index + 1]}"] if index < 2 else []
        procs.append(
            receiver(
                "--listen",
                f"127.0.0.1:{ports[index]}",
                "--out",
                str(tmp_path / f"n{index}.bin"),
                "--sha256",
                digest,
                *nxt,
            )
        )
    time.sleep(0.3)
    assert send(ports[0], "--file", str(src)).returncode == 0
    for proc in procs:
        assert proc.wait(timeout=30) == 0
        assert json.loads(proc.stdout.read() if proc.stdout else "{}")["ok"]
    for index in range(3):
        assert (tmp_path / f"n{index}.bin").read_bytes() == src.read_bytes()


def test_checksum_mismatch_removes_the_file_and_exits_3(tmp_path: Path, payload: tuple[Path, str]) -> None:
    src, _digest = payload
    port = free_port()
    proc = receiver("--listen", f"127.0.0.1:{port}", "--out", str(tmp_path / "out.bin"), "--sha256", "0" * 64)
    time.sleep(0.3)
    send(port, "--file", str(src))
    assert proc.wait(timeout=30) == 3
    assert "expected 0000" in (proc.stdout.read() if proc.stdout else "")
    assert not (tmp_path / "out.bin").exists() and not (tmp_path / "out.bin.part").exists()


def test_directory_travels_as_a_tar_stream(tmp_path: Path) -> None:
    source = tmp_path / "model"
    (source / ".git").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(os.urandom(100_000))
    port = free_port()
    proc = receiver("--listen", f"127.0.0.1:{port}", "--untar", str(tmp_path / "copy"))
    time.sleep(0.3)
    assert send(port, "--tar-dir", str(source)).returncode == 0
    assert proc.wait(timeout=30) == 0
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["config.json", "model.safetensors"]
