"""The gateway role's facts (what ``gpufleet status`` shows of the routers) read a real vllm-router's own
view of its workers: one worker answering, one gone.

The router runs here, on loopback, from the lab bundle's wheel and through the role's own launcher
(``roles/gateway/files/gpufleet_router.py``) with this machine's python3, as the role runs it on a host. Its
two workers are stand-in HTTP servers (the router asks them only ``/health`` here: no request is routed).
Then ``facts.yml`` runs on localhost through ansible-playbook, and its ``gateway_report`` is read as the
status report reads it. The end-to-end lab test covers the healthy case through ``gpufleet status`` itself.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN, run_playbook

from gpufleet.runner.report import RouterState

LAUNCHER = REPO / "roles" / "gateway" / "files" / "gpufleet_router.py"


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def workers() -> Iterator[list[http.server.ThreadingHTTPServer]]:
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


def test_the_facts_name_the_worker_the_router_took_out(
    lab_bundle: Path, workers: list[http.server.ThreadingHTTPServer], tmp_path: Path
) -> None:
    (wheel,) = sorted((lab_bundle / "gateway").glob("vllm_router-*.whl"))
    router_dir, configs = tmp_path / "router", tmp_path / "gateway"
    configs.mkdir()
    with zipfile.ZipFile(wheel) as unpacked:
        unpacked.extractall(router_dir)
    urls = [f"http://127.0.0.1:{server.server_address[1]}" for server in workers]
    port, metrics_port = free_port(), free_port()
    service = {"name": "tiny", "port": port, "metrics_port": metrics_port, "workers": urls}
    args = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls, "--policy", "round_robin",
            "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]  # fmt: skip
    config = configs / "tiny.json"
    config.write_text(
        json.dumps({"path": str(router_dir), "service": service, "args": args}), encoding="utf-8"
    )
    log = (tmp_path / "router.log").open("w")
    router = subprocess.Popen(
        ["/usr/bin/python3", "-s", str(LAUNCHER), str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while "vllm_router_worker_health{" not in metrics(metrics_port) and time.monotonic() < deadline:
            assert router.poll() is None, (tmp_path / "router.log").read_text()
            time.sleep(0.5)
        workers[1].shutdown()  # the second worker is gone: the router takes it out after two failed checks
        workers[1].server_close()
        gone = f'vllm_router_worker_health{{worker="{urls[1]}"}} 0'
        while gone not in metrics(metrics_port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert gone in metrics(metrics_port), metrics(metrics_port)

        report = run_facts(configs, tmp_path)
    finally:
        os.killpg(router.pid, signal.SIGTERM)
        router.wait(30)
        log.close()

    # No unit of that name here: systemd says inactive, or nothing where this machine runs no systemd.
    assert [entry.pop("active") for entry in report] in (["inactive"], ["unknown"])
    seen = {"service": "tiny", "port": port, "workers": urls, "healthy": urls[:1], "answered": True}
    assert report == [seen]
    (state,) = [RouterState.model_validate(entry) for entry in report]
    assert state.model_copy(update={"active": "active"}).problems == [
        f"gateway tiny: degraded, the router finds unhealthy: {urls[1]}"
    ]


def run_facts(configs: Path, tmp_path: Path) -> list[dict[str, object]]:
    """facts.yml on localhost; its gateway_report."""
    out = tmp_path / "report.json"
    play = tmp_path / "facts.yml"
    play.write_text(
        f"""- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: gateway
        tasks_from: facts.yml
      vars:
        gateway_config_dir: {configs}
        gateway_service_name: gpufleet-test
    - ansible.builtin.copy:
        content: "{{{{ gateway_report | to_json }}}}"
        dest: {out}
""",
        encoding="utf-8",
    )
    local = ["-i", "localhost,", "-e", f"ansible_python_interpreter={VENV_BIN / 'python'}"]
    ran = run_playbook([str(VENV_BIN / "ansible-playbook"), *local, str(play)], timeout=300)
    assert ran.returncode == 0, ran.stdout[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(report, list)
    return report
