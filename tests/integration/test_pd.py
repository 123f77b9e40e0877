"""Prefill/decode disaggregation (role vllm_pd, playbooks/serve_pd.yml) on an offline lab of its own: 1P2D.

node1 is the Ray head, the prefill instance and the proxy; node2 and node3 each run a decode instance. One
prepare (molecule/ray_cluster/prepare.yml: Docker, the CPU serving image, the tiny model on every host), then
playbooks/cluster.yml (Ray in the containers the instances run in) and playbooks/serve_pd.yml.

KV transfer is OFF here: the lab's image is vLLM's CPU build, which has neither NIXL/UCX nor NCCL, so the run
sets the test-only switch ``vllm_pd_test_only_no_kv_transfer: true`` (no --kv-transfer-config; each decode
instance computes the prompt again). What this proves: the role renders and starts both pools and the proxy on
real hosts, the proxy's routing (prefill on node1, decode round-robin over node2/node3, seen in the
X-Gpufleet-Prefill / X-Gpufleet-Decode headers) and its key check (401 without the key), streaming through the
proxy, a second run and a check-mode run that change nothing, ``vllm_pd_state=status`` and
``vllm_pd_state=stopped`` (proxy, then decode, then prefill). What it cannot prove: that KV blocks move from
prefill to decode (NixlConnector / P2pNcclConnector) — that needs GPUs (issue 17 item 4).
"""

from __future__ import annotations

import itertools
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, VENV_BIN, ansible_env, lab_name, run_playbook, skip_unless_lab_possible

from gpufleet.lab import Lab, LabInventory
from gpufleet.lab.serving_image import DEFAULT_SPEC, ImageSpec, build

# heavy: a lab of its own with three vLLM instances on 2 cores costs minutes that `make test` (CI, under
# 45 min with the e2e, relay, cancel and Molecule labs) has no room for; `make test-all` runs it.
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(2400)]

PREFILL = "node1"
DECODE = ("node2", "node3")
UNITS = {"proxy": "gpufleet-pd-proxy", "instance": "gpufleet-vllm-pd"}


@dataclass
class PdLab:
    lab: Lab
    inventory: LabInventory
    hosts_file: Path
    workdir: Path
    seconds: dict[str, float]

    @property
    def key(self) -> str:
        return (self.workdir / "gpufleet.apikey").read_text(encoding="utf-8").strip()

    @property
    def proxy(self) -> str:
        return f"http://{self.inventory.ips[PREFILL]}:8000"

    def playbook(self, playbook: str, *args: str, env: dict[str, str] | None = None) -> str:
        """ansible-playbook against this lab; asserts success and returns the output."""
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(self.hosts_file), str(REPO / playbook), *args]
        result = run_playbook(argv, timeout=1800, env=ansible_env() | (env or {}))
        log = self.workdir / (re.sub(r"\W", "_", playbook + "_".join(args))[:120] + ".log")
        log.write_text(result.stdout, encoding="utf-8")
        assert result.returncode == 0, f"{playbook} {args} failed (log {log}):\n{result.stdout[-6000:]}"
        key = self.workdir / "gpufleet.apikey"
        if key.exists():
            assert self.key not in result.stdout, f"the API key appeared in the output of {playbook} {args}"
        return result.stdout

    def timed(self, what: str, playbook: str, *args: str, env: dict[str, str] | None = None) -> str:
        start = time.monotonic()
        out = self.playbook(playbook, *args, env=env)
        self.seconds[what] = round(time.monotonic() - start, 1)
        return out

    def ssh(self, host: str, command: str) -> str:
        result = self.lab.ssh(host, command, timeout=60)
        return result.stdout.strip()


def recap(out: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP per host: {'node1': {'ok': 3, 'changed': 0, ...}}."""
    hosts: dict[str, dict[str, int]] = {}
    for line in out[out.rindex("PLAY RECAP") :].splitlines()[1:]:
        match = re.match(r"^(\S+)\s*:\s*(.*)$", line)
        if match:
            hosts[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
    return hosts


def write_inventory(lab: LabInventory, directory: Path) -> Path:
    """The lab's hosts with the two pools (1P2D) and the lab's group_vars (inventories/lab/group_vars)."""
    tree: dict[str, Any] = yaml.safe_load(lab.inventory.read_text(encoding="utf-8"))
    children = tree["all"]["children"]["gpu_nodes"]["children"]
    children["vllm_prefill"] = {"hosts": {PREFILL: None}}
    children["vllm_decode"] = {"hosts": dict.fromkeys(DECODE)}
    tree["all"]["vars"] = {"vllm_pd_test_only_no_kv_transfer": True}
    hosts = directory / "hosts.yml"
    hosts.write_text(yaml.safe_dump(tree, explicit_start=True, sort_keys=False), encoding="utf-8")
    (directory / "group_vars").symlink_to(REPO / "inventories" / "lab" / "group_vars")
    return hosts


@pytest.fixture(scope="module")
def pd_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PdLab]:
    skip_unless_lab_possible()
    workdir = tmp_path_factory.mktemp("pd")
    seconds: dict[str, float] = {}
    start = time.monotonic()
    image = build(ImageSpec.load(DEFAULT_SPEC))
    handle = Lab(lab_name("pd"), nodes=3, offline=True)
    try:
        inventory = handle.up()
        seconds["image+up"] = round(time.monotonic() - start, 1)
        pd = PdLab(handle, inventory, write_inventory(inventory, workdir), workdir, seconds)
        prepare_env = {
            "MOLECULE_EPHEMERAL_DIRECTORY": str(workdir),
            "GPUFLEET_SERVING_IMAGE": json.dumps(asdict(image) | {"path": str(image.path)}),
            "GPUFLEET_TEST_API_KEY_FILE": str(workdir / "gpufleet.apikey"),
        }
        pd.timed("prepare", "molecule/ray_cluster/prepare.yml", env=prepare_env)
        pd.timed("cluster", "playbooks/cluster.yml")
        pd.timed("serve_pd", "playbooks/serve_pd.yml")
        yield pd
    finally:
        handle.down()
        seconds["total"] = round(time.monotonic() - start, 1)
        print(f"pd lab: seconds {json.dumps(seconds)}")


def post(url: str, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as failed:
        return failed.code, dict(failed.headers), failed.read()


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}


def test_the_proxy_routes_prefill_to_node1_and_decode_round_robin(pd_lab: PdLab) -> None:
    routes = []
    for _ in range(4):
        status, headers, body = post(pd_lab.proxy + "/v1/chat/completions", CHAT, pd_lab.key)
        assert status == 200, body[-2000:]
        assert json.loads(body)["choices"][0]["message"]["content"]
        routes.append((headers.get("X-Gpufleet-Prefill"), headers.get("X-Gpufleet-Decode")))
    assert {prefill for prefill, _ in routes} == {PREFILL}, routes
    decodes = [decode for _, decode in routes]
    assert set(decodes) == set(DECODE), routes
    assert all(a != b for a, b in itertools.pairwise(decodes)), f"not alternating: {routes}"


def test_the_proxy_refuses_without_the_key(pd_lab: PdLab) -> None:
    status, _, _ = post(pd_lab.proxy + "/v1/chat/completions", CHAT, None)
    assert status == 401
    status, _, _ = post(pd_lab.proxy + "/v1/chat/completions", CHAT, "x" * 64)
    assert status == 401


def test_a_streamed_chat_completion_comes_through_the_proxy(pd_lab: PdLab) -> None:
    status, headers, body = post(pd_lab.proxy + "/v1/chat/completions", CHAT | {"stream": True}, pd_lab.key)
    assert status == 200, body[-2000:]
    assert headers.get("Content-Type", "").startswith("text/event-stream"), headers
    events = [line[len("data: ") :] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(event) for event in events[:-1]]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert len(deltas) > 1 and "".join(delta.get("content") or "" for delta in deltas)
    assert headers.get("X-Gpufleet-Prefill") == PREFILL and headers.get("X-Gpufleet-Decode") in DECODE


def test_a_second_run_changes_nothing(pd_lab: PdLab) -> None:
    out = pd_lab.timed("serve_pd again", "playbooks/serve_pd.yml")
    assert {host: counts["changed"] for host, counts in recap(out).items()} == dict.fromkeys(
        (PREFILL, *DECODE), 0
    ), out[-4000:]


def test_check_mode_on_the_deployed_lab_changes_and_fails_nothing(pd_lab: PdLab) -> None:
    out = pd_lab.timed("serve_pd --check", "playbooks/serve_pd.yml", "--check", "--diff")
    for host, counts in recap(out).items():
        bad = {k: counts.get(k, 0) for k in ("changed", "failed", "unreachable") if counts.get(k, 0)}
        assert not bad, (host, bad, out[-4000:])
    # and the proxy still serves (check mode restarted nothing)
    status, _, _ = post(pd_lab.proxy + "/v1/chat/completions", CHAT, pd_lab.key)
    assert status == 200


JSON_RESULTS = {"ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}  # the status message on one line


def pd_status(out: str) -> dict[str, Any]:
    """gpufleet_pd_status as the role's last task shows it (run with JSON_RESULTS)."""
    match = re.search(r'"msg": "(\{.*\})"', out)
    assert match, out[-4000:]
    return json.loads(json.loads(f'"{match.group(1)}"'))


def test_status_reports_both_pools_and_the_proxy(pd_lab: PdLab) -> None:
    out = pd_lab.timed("status", "playbooks/serve_pd.yml", "-e", "vllm_pd_state=status", env=JSON_RESULTS)
    assert {counts["changed"] for counts in recap(out).values()} == {0}
    state = pd_status(out)
    assert state[PREFILL]["pool"] == "prefill" and state[PREFILL]["proxy_unit"] == "active"
    for host in (PREFILL, *DECODE):
        assert state[host]["instance_unit"] == "active" and state[host]["instance_ready"] is True, state
    for host in DECODE:
        assert state[host]["pool"] == "decode", state
    assert set(state[PREFILL]["proxy"]["decode"]) == set(DECODE), state


def stop_window(pd_lab: PdLab, host: str, unit: str) -> tuple[int, int]:
    """When systemd began and finished stopping the unit (journal realtime, µs: one clock for all lab hosts).

    Read from the journal: a unit that is stopped and disabled is unloaded, and systemctl show forgets it.
    """
    assert pd_lab.ssh(host, f"systemctl is-active {unit}") == "inactive", (host, unit)
    lines = pd_lab.ssh(host, f"journalctl --unit {unit} --output json --no-pager --lines 400").splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]

    def last(prefix: str) -> int:
        times = [int(e["__REALTIME_TIMESTAMP"]) for e in entries if str(e.get("MESSAGE")).startswith(prefix)]
        assert times, (host, unit, prefix)
        return times[-1]

    return last(f"Stopping {unit}.service"), last(f"Stopped {unit}.service")


def test_stopped_stops_the_proxy_then_decode_then_prefill_and_status_says_so(pd_lab: PdLab) -> None:
    out = pd_lab.timed("stop", "playbooks/serve_pd.yml", "-e", "vllm_pd_state=stopped")
    assert recap(out)[PREFILL]["changed"] > 0
    proxy = stop_window(pd_lab, PREFILL, UNITS["proxy"])
    decode = [stop_window(pd_lab, host, UNITS["instance"]) for host in DECODE]
    prefill = stop_window(pd_lab, PREFILL, UNITS["instance"])
    # each pool began stopping only after the one before it had stopped
    assert proxy[1] <= min(d[0] for d in decode) and max(d[1] for d in decode) <= prefill[0], (
        proxy,
        decode,
        prefill,
    )
    for host in (PREFILL, *DECODE):
        assert pd_lab.ssh(host, f"systemctl is-enabled {UNITS['instance']}") == "disabled"
    again = pd_lab.timed("stop again", "playbooks/serve_pd.yml", "-e", "vllm_pd_state=stopped")
    assert {counts["changed"] for counts in recap(again).values()} == {0}
    state = pd_status(
        pd_lab.playbook("playbooks/serve_pd.yml", "-e", "vllm_pd_state=status", env=JSON_RESULTS)
    )
    assert state[PREFILL]["proxy_unit"] == "inactive", state
    for host in (PREFILL, *DECODE):
        assert state[host]["instance_unit"] == "inactive" and state[host]["instance_ready"] is False, state
