"""vLLM as a client and the head see it: the unit, the API key, a deterministic chat completion."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import group_hosts

# With the ray executor vLLM serves on the head only; the workers are Ray's (molecule/ray_cluster).
testinfra_hosts = group_hosts("ray_head", 1)

KEY_FILE = Path(
    os.environ.get("GPUFLEET_TEST_API_KEY_FILE")
    or Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "gpufleet.apikey"
)
CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Say hello to the cluster."}],
    "temperature": 0,
    "max_tokens": 16,
}


def api(host, path: str, body: dict | None = None, key: str | None = None) -> tuple[int, dict]:
    """One request from the control node to the head's API (lab network only)."""
    url = f"http://{host.ansible.get_variables()['gpufleet_node_ip']}:8000{path}"
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}


@pytest.fixture(scope="module")
def key() -> str:
    return KEY_FILE.read_text(encoding="utf-8").strip()


def test_key_file_is_private_and_long(host, key: str) -> None:
    assert KEY_FILE.stat().st_mode & 0o777 == 0o600
    assert len(key) >= 43


def test_vllm_unit_is_running_and_enabled(host) -> None:
    unit = host.service("gpufleet-vllm@default")
    assert unit.is_running
    assert unit.is_enabled


def test_vllm_unit_was_verified_by_systemd(host) -> None:
    """The template unit was written through validate: (systemd-analyze verify, as instance default); the
    instance verifies on the host as written, its drop-in included."""
    assert host.run("systemd-analyze verify gpufleet-vllm@default.service").rc == 0


def test_the_api_listens_on_the_cluster_address_only(host) -> None:
    ip = host.ansible.get_variables()["gpufleet_node_ip"]
    assert host.socket(f"tcp://{ip}:8000").is_listening
    assert not host.socket("tcp://0.0.0.0:8000").is_listening


def test_models_lists_the_served_model(host, key: str) -> None:
    status, body = api(host, "/v1/models", key=key)
    assert status == 200
    assert [model["id"] for model in body["data"]] == ["tiny"]


def test_request_without_the_key_is_refused(host) -> None:
    status, _ = api(host, "/v1/chat/completions", CHAT)
    assert status == 401


def test_request_with_a_wrong_key_is_refused(host) -> None:
    status, _ = api(host, "/v1/models", key="not-the-key")
    assert status == 401


def test_chat_completion_is_deterministic_at_temperature_zero(host, key: str) -> None:
    first_status, first = api(host, "/v1/chat/completions", CHAT, key)
    second_status, second = api(host, "/v1/chat/completions", CHAT, key)
    assert first_status == second_status == 200
    assert first["usage"]["completion_tokens"] > 0
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def test_key_appears_in_no_log_or_world_readable_file(host, key: str) -> None:
    journal = host.run("journalctl --no-pager -o cat").stdout
    assert key not in journal
    assert key not in host.file("/etc/gpufleet/instances/default/vllm.yaml").content_string
    env_file = host.file("/etc/gpufleet/instances/default/vllm.env")
    assert env_file.mode == 0o600 and env_file.user == "root"


def test_config_file_has_the_lab_settings(host) -> None:
    config = host.file("/etc/gpufleet/instances/default/vllm.yaml").content_string
    for line in ("served-model-name: tiny", "max-model-len: 512", "block-size: 32", "enforce-eager: true"):
        assert line in config.splitlines()
