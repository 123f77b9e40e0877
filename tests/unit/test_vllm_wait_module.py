"""gpufleet_vllm_wait against a real HTTP server on loopback: ready when /v1/models lists the model; a key
vLLM refuses ends the wait at once (waiting cannot fix it) instead of after vllm_service_start_timeout."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .conftest import module_env

MODULE = Path(__file__).resolve().parents[2] / "plugins/modules/gpufleet_vllm_wait.py"


class _Vllm(http.server.BaseHTTPRequestHandler):
    """/v1/models as vLLM answers it: 401 without the key, else the served model."""

    key: ClassVar[str] = "sekrit"

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"data": [{"id": "tiny"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vllm)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def wait(tmp_path: Path, **args: Any) -> dict[str, Any]:
    """The module's result; an argument given as None is left to the module's default."""
    given = {"unit": "gpufleet-test-no-such.service", "timeout": 20, "interval": 1, **args}
    params = {name: value for name, value in given.items() if value is not None}
    arguments = tmp_path / "args.json"
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    done = subprocess.run(
        [sys.executable, str(MODULE), str(arguments)],
        capture_output=True,
        text=True,
        check=False,
        env=module_env(tmp_path),
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_listed_model_ends_the_wait(url: str, tmp_path: Path) -> None:
    result = wait(tmp_path, url=url, api_key="sekrit", served_model="tiny")

    assert not result.get("failed") and result["status"] == 200 and result["why"] == ""


def test_a_refused_key_ends_the_wait_at_once_and_the_key_is_not_shown(url: str, tmp_path: Path) -> None:
    result = wait(tmp_path, url=url, api_key="other-key", served_model="tiny")

    assert result["failed"] and result["why"] == "key" and result["status"] == 401
    assert "refuses the API key" in result["msg"] and result["seconds"] < 5
    assert "other-key" not in json.dumps(result)


class _Starting(_Vllm):
    """vLLM still starting until ready_at (503), then as _Vllm."""

    ready_at: ClassVar[float] = 0.0

    def do_GET(self) -> None:
        if time.monotonic() < self.ready_at:
            self.send_response(503)
            self.end_headers()
            return
        super().do_GET()


def test_by_default_the_wait_ends_within_a_second_of_the_model_being_listed(tmp_path: Path) -> None:
    """Every cold deploy's serve stage waits here for vLLM (30-50 s on the lab): polling every 5 s cost 2.5 s
    on average after vLLM was ready. The default polls every second."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Starting)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        _Starting.ready_at = time.monotonic() + 2.2
        result = wait(
            tmp_path,
            url=f"http://127.0.0.1:{httpd.server_address[1]}",
            api_key="sekrit",
            served_model="tiny",
            interval=None,
        )
        after_ready = time.monotonic() - _Starting.ready_at
    finally:
        httpd.shutdown()

    # status 200: the module saw the model listed, so it did not end before ready_at. Polling every 5 s, its
    # second poll comes 5 s after it started, at least 2.8 s after ready_at; polling every second, about 1 s.
    assert result["why"] == "" and result["status"] == 200, result
    assert after_ready < 2.0, (after_ready, result)
