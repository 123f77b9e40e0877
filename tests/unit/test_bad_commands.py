# ruff: noqa: E501 - the cases are a table, one case per entry, easier to read unwrapped
"""Every CLI command and every reader refuses bad input in one line: where, what was found, what was
expected and the fix; no traceback, no wrong acceptance, nothing written or booted (issue 13, item 7).

Before (each case): `init DIR` with DIR a file was a NotADirectoryError traceback; `init --model ../..` and a
binary `--model-config` were accepted; `teardown -i` of a binary file ran and reported "ok"; `lab up
--inventory FILE` overwrote a file it had not written (and `lab down` then deleted it); `demo --name ../x`
built the bundle before refusing the name and `demo --bundle FILE` ended in "[Errno 17] File exists";
`validate` accepted a gpufleet_bundle_dir that is a file or whose lock is unreadable, .inf/.nan were "less
than or equal to 1024" (or accepted: vllm_service_cpu_offload_gb .inf), a group_vars file holding a list or
a bare string was Ansible's "failed to combine variables" naming no file, and a hosts file holding a list
was three Ansible warnings; a lock with `size: true` was read as size 1; a lock with bytes that are not UTF-8
said "'utf-8' codec can't decode byte"; `bundle verify FILE` said "[Errno 20] Not a directory"; `deploy
--bundle` with an unreadable lock ran the preflight stage before refusing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "models" / "Qwen2.5-1.5B-Instruct" / "config.json"
PLAN = ["plan", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--max-model-len", "4096"]
PLAN += ["--gpu-memory-gib", "80", "--model"]
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfebinary"
ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="lab and demo commands need root")


PROD = REPO / "inventories" / "prod"  # services
TP = REPO / "inventories" / "examples" / "tp-across-nodes"  # the one-model form (vllm_service_*)


def prod(tmp_path: Path, source: Path = PROD) -> Path:
    inventory = tmp_path / "inv"
    shutil.copytree(source, inventory)
    group_vars = inventory / "group_vars" / "gpu_nodes.yml"
    group_vars.write_text(
        re.sub(r"(\.\./)+models/Qwen2\.5-1\.5B-Instruct/config\.json", str(CONFIG), group_vars.read_text())
    )
    return inventory


def lock_dir(tmp_path: Path, content: bytes) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.lock.yml").write_bytes(content)
    return bundle


def config(tmp_path: Path, **changes: object) -> Path:
    data = json.loads(CONFIG.read_text())
    data.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def file_at(tmp_path: Path, data: bytes = BINARY, name: str = "afile") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def edited(tmp_path: Path, relpath: str, old: str | None, new: str) -> Path:
    inventory = prod(tmp_path)
    target = inventory / relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    if old is None:
        target.write_text(new)
    else:
        assert old in target.read_text(), old
        target.write_text(target.read_text().replace(old, new))
    return inventory


def appended(tmp_path: Path, relpath: str, data: bytes, source: Path = PROD) -> Path:
    inventory = prod(tmp_path, source)
    with (inventory / relpath).open("ab") as out:
        out.write(data)
    return inventory


INIT = ["--head", "h=10.0.0.1", "--model", "org/name", "--gpu", "NVIDIA H100"]
SIZE_TRUE = (
    "manifest: t\nfiles:\n- path: a\n  size: true\n  sha256: '"
    + "e" * 64
    + "'\n  version: '1'\n  source: s\n"
).encode()

# name -> (argv from tmp_path, exit code, the text that names what was found)
Case = tuple[Callable[[Path], list[str]], int, str]
CASES: dict[str, Case] = {
    # init: the inventory writer
    "init DIR is an existing file": (
        lambda t: ["init", str(file_at(t)), *INIT], 2, "is a file, not a directory"),
    "init --model leaving its org": (
        lambda t: ["init", str(t / "o"), "--head", "h=10.0.0.1", "--model", "../..", "--gpu", "X"], 2, "found '../..'"),
    "init --model-config binary": (
        lambda t: ["init", str(t / "o"), *INIT, "--model-config", str(file_at(t))], 2, "not UTF-8 at offset"),
    "init --model-config a JSON list": (
        lambda t: ["init", str(t / "o"), *INIT, "--model-config", str(file_at(t, b"[1]", "c.json"))],
        2, "found a JSON list"),
    "init --gpu-memory-gib inf": (
        lambda t: ["init", str(t / "o"), *INIT, "--gpu-memory-gib", "inf"], 2, "found inf"),
    "init --gpus-per-node 0": (
        lambda t: ["init", str(t / "o"), *INIT, "--gpus-per-node", "0"], 2, "found 0"),
    "init invalid IP": (
        lambda t: ["init", str(t / "o"), "--head", "h=10.0.0.300", *INIT[2:]], 2, "found address '10.0.0.300'"),
    # validate: inventory, group_vars, host_vars, the bundle it names
    "validate host_vars holding a list": (
        lambda t: ["validate", "-i", str(edited(t, "host_vars/gpu-head-01.yml", None, "- a\n- b\n"))],
        1, "host_vars/gpu-head-01.yml: -i: found a YAML list at the top level"),
    "validate group_vars holding a bare string": (
        lambda t: ["validate", "-i", str(edited(t, "group_vars/all.yml", None, "just words\n"))],
        1, "all.yml: -i: found a YAML str scalar at the top level"),
    "validate hosts file holding a list": (
        lambda t: ["validate", "-i", str(edited(t, "hosts.yml", None, "- gpu-head-01\n"))],
        1, "hosts.yml: -i: found a YAML list at the top level"),
    "validate gpu memory .nan": (
        lambda t: ["validate", "-i", str(edited(t, "hosts.yml", "memory_gib: 23.69", "memory_gib: .nan"))],
        1, "gpufleet_gpu_memory_gib: found nan; expected a finite number"),
    "validate cpu offload .inf": (
        lambda t: ["validate", "-i", str(appended(t, "group_vars/gpu_nodes.yml", b"vllm_service_cpu_offload_gb: .inf\n", TP))],
        1, "vllm_service_cpu_offload_gb: found inf; expected a finite number"),
    "validate node IP out of range": (
        lambda t: ["validate", "-i", str(edited(t, "hosts.yml", "node_ip: 10.10.0.10", "node_ip: 10.10.0.300"))],
        1, "gpufleet_node_ip: found '10.10.0.300'"),
    "validate GPU count true": (
        lambda t: ["validate", "-i", str(edited(t, "hosts.yml", "gpu_count: 1\n          gpufleet_gpu_model: NVIDIA G",
                                                 "gpu_count: true\n          gpufleet_gpu_model: NVIDIA G"))],
        1, "gpufleet_gpu_count: found True; expected a number, not true/false"),
    "validate bundle dir that is a file": (
        lambda t: ["validate", "-i", str(appended(t, "group_vars/gpu_nodes.yml", f"gpufleet_bundle_dir: {file_at(t)}\n".encode()))],
        1, "gpufleet_bundle_dir: found"),
    "validate bundle whose lock is not UTF-8": (
        lambda t: ["validate", "-i", str(appended(t, "group_vars/gpu_nodes.yml", f"gpufleet_bundle_dir: {lock_dir(t, BINARY)}\n".encode()))],
        1, "gpufleet_bundle_dir: found an unreadable lock"),
    # deploy -e
    "deploy -e without a value": (
        lambda t: ["deploy", "-i", str(t), "-e", "gpufleet_monitoring"], 2, "expected NAME=VALUE"),
    "deploy -e with a bad name": (lambda t: ["deploy", "-i", str(t), "-e", "a-b=1"], 2, "expected NAME=VALUE"),
    # plan: config.json
    "plan config.json hidden_size true": (
        lambda t: [*PLAN, str(config(t, hidden_size=True))], 2, "hidden_size: found True"),
    "plan config.json layers as a string": (
        lambda t: [*PLAN, str(config(t, num_hidden_layers="28"))], 2, "num_hidden_layers: found '28'"),
    "plan config.json layers 1e400": (
        lambda t: [*PLAN, str(file_at(t, CONFIG.read_bytes().replace(b'"num_hidden_layers": 28', b'"num_hidden_layers": 1e400'), "c.json"))],
        2, "num_hidden_layers: found inf"),
    "plan -i a binary file": (lambda t: ["plan", "-i", str(file_at(t))], 1, "found bytes that are not UTF-8"),
    # bundle: the lock reader
    "bundle verify lock not UTF-8": (
        lambda t: ["bundle", "verify", str(lock_dir(t, b"files: [\xff]\n"))], 1, "found bytes that are not UTF-8 at offset 8"),
    "bundle verify lock holding a list": (
        lambda t: ["bundle", "verify", str(lock_dir(t, b"- a\n"))], 1, "top level: found a list; expected"),
    "bundle verify size true": (
        lambda t: ["bundle", "verify", str(lock_dir(t, SIZE_TRUE))], 1, "files.0.size: found True; expected"),
    "bundle verify DIR is a file": (
        lambda t: ["bundle", "verify", str(file_at(t))], 1, "found a file; expected a bundle directory"),
    # deploy, teardown, status: refused before any stage runs
    "deploy --bundle whose lock is binary": (
        lambda t: ["deploy", "-i", str(prod(t)), "--bundle", str(lock_dir(t, BINARY))], 2, "found bytes that are not UTF-8"),
    "deploy --stages unknown": (
        lambda t: ["deploy", "-i", str(prod(t)), "--stages", "nodes,bogus"], 2, "stage 'bogus': unknown"),
    "deploy -i a binary file": (lambda t: ["deploy", "-i", str(file_at(t))], 1, "found bytes that are not UTF-8"),
    "deploy --load-interval 0": (
        lambda t: ["deploy", "-i", str(prod(t)), "--load-interval", "0"], 2, "--load-interval: found '0'"),
    "deploy --load-interval nan": (
        lambda t: ["deploy", "-i", str(prod(t)), "--load-interval", "nan"], 2, "--load-interval: found 'nan'"),
    "rollback --load-interval inf": (
        lambda t: ["rollback", "-i", str(prod(t)), "--load-interval", "inf"], 2, "--load-interval: found 'inf'"),
    "rollback --load -1": (lambda t: ["rollback", "-i", str(prod(t)), "--load=-1"], 2, "--load: found '-1'"),
    "deploy --load 1.5": (lambda t: ["deploy", "-i", str(prod(t)), "--load", "1.5"], 2, "--load: found '1.5'"),
    "deploy --load 65": (lambda t: ["deploy", "-i", str(prod(t)), "--load", "65"], 2, "--load: found '65'"),
    "deploy --load in another script's digits": (
        lambda t: ["deploy", "-i", str(prod(t)), "--load", "\u0661"], 2, "--load: found '\u0661'"),
    "deploy --load-interval 1e-9": (
        lambda t: ["deploy", "-i", str(prod(t)), "--load-interval", "1e-9"], 2, "--load-interval: found '1e-9'"),
    "teardown -i a binary file": (lambda t: ["teardown", "-i", str(file_at(t))], 1, "found bytes that are not UTF-8"),
    "teardown -i hosts with latin-1": (
        lambda t: ["teardown", "-i", str(appended(t, "hosts.yml", b"# caf\xe9\n"))], 1, "found bytes that are not UTF-8"),
    "teardown -i with no gpu_nodes": (
        lambda t: ["teardown", "-i", str(edited(t, "hosts.yml", None, "other:\n  hosts:\n    a:\n"))],
        1, "found no hosts in group gpu_nodes"),
}  # fmt: skip

# Each lab case also carries a name the lab itself refuses: a broken check then fails the test, never boots.
ROOT_CASES: dict[str, Case] = {
    "lab up --nodes 0": (lambda t: ["lab", "up", "--name", "bad-input", "--nodes", "0"], 2, "--nodes: found '0'"),
    "lab up --nodes inf": (lambda t: ["lab", "up", "--name", "bad-input", "--nodes", "inf"], 2, "--nodes: found 'inf'"),
    "lab up --name leaving the state dir": (lambda t: ["lab", "up", "--name", "../evil"], 1, "found '../evil'"),
    "lab up --inventory over a user's file": (
        lambda t: ["lab", "up", "--name", "../no-boot", "--inventory", str(file_at(t, b"mine\n"))],
        1, "found a file that `gpufleet lab up` did not write"),
    "lab down --name leaving the state dir": (lambda t: ["lab", "down", "--name", "../../etc"], 1, "found '../../etc'"),
    "demo --name leaving the state dir": (lambda t: ["demo", "--name", "../evil"], 2, "--name: found '../evil'"),
    "demo --bundle a file": (
        lambda t: ["demo", "--name", "../no-boot", "--bundle", str(file_at(t))], 2, "--bundle: " ),
}  # fmt: skip


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    out = captured.err + captured.out
    assert "Traceback" not in out, out
    return code, out


def check(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    argv, code, found = case
    exit_code, out = refused(argv(tmp_path), capsys)
    assert exit_code == code, out
    line = next((line for line in out.splitlines() if found in line), None)
    assert line is not None, out
    assert "expected" in line and "fix:" in line.lower(), line  # where and what: the case's own text
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_refused_in_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check(CASES[name], tmp_path, capsys)


@pytest.mark.parametrize("name", sorted(ROOT_CASES))
@pytest.mark.skipif(os.geteuid() != 0, reason="lab and demo commands need root")
def test_bad_lab_and_demo_input_is_refused_before_anything_boots(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check(ROOT_CASES[name], tmp_path, capsys)
    assert not list(tmp_path.glob("bundle*")), "nothing built"


def test_lab_up_leaves_the_users_file_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("lab commands need root")
    mine = file_at(tmp_path, b"mine\n", "hosts.yml")
    refused(["lab", "up", "--name", "../no-boot", "--inventory", str(mine)], capsys)
    assert mine.read_bytes() == b"mine\n"


def test_status_names_a_missing_inventory_and_its_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """status (commands/status.py belongs to another change) refuses before Ansible runs; the runner's line
    names the path, what it found and the fix."""
    code, out = refused(["status", "-i", str(tmp_path / "nope")], capsys)
    assert code == 2 and f"inventory {tmp_path / 'nope'}: no such file or directory. Fix: pass -i" in out


def test_init_writes_nothing_when_it_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["init", str(tmp_path / "o"), *INIT, "--model-config", str(file_at(tmp_path))], capsys)
    assert not (tmp_path / "o").exists()


def test_a_fleet_the_schema_refuses_is_a_problem_not_a_silent_none(tmp_path: Path) -> None:
    """_build_fleet used to swallow FleetSpec's ValidationError (the one-head check): a fleet that reached
    it without a head then had no fleet and no problem."""
    from gpufleet.fleet.raw import RawHost, RawInventory
    from gpufleet.fleet.validate import Validation, _build_fleet

    variables = {
        "ansible_host": "192.0.2.10",
        "gpufleet_node_ip": "10.0.0.10",
        "gpufleet_nic": "eth0",
        "gpufleet_gpu": False,
        "gpufleet_model_repo": "org/name",
        "gpufleet_model_dir": "/opt/models/name",
    }
    host = RawHost("w1", frozenset({"gpu_nodes", "ray_workers"}), variables)
    result = Validation()
    assert _build_fleet(RawInventory(path=tmp_path, hosts=(host,), problems=()), [host], result) is None
    (problem,) = result.problems
    assert "exactly one node in group ray_head" in str(problem) and "Fix:" in str(problem), problem


def test_gpufleet_reads_each_inventory_file_once_before_ansible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The UTF-8 check and the duplicate-key check read every file separately before (twice per file)."""
    from collections import Counter

    from gpufleet.fleet.inventory import _duplicate_keys

    inventory = prod(tmp_path)
    reads: Counter[str] = Counter()
    read_bytes, read_text = Path.read_bytes, Path.read_text

    def counted_bytes(self: Path) -> bytes:
        reads[self.name] += 1
        return read_bytes(self)

    def counted_text(self: Path, *args: object, **kwargs: object) -> str:
        reads[self.name] += 1
        return read_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_bytes", counted_bytes)
    monkeypatch.setattr(Path, "read_text", counted_text)
    assert list(_duplicate_keys(inventory)) == []
    assert reads == Counter({"hosts.yml": 1, "all.yml": 1, "gpu_nodes.yml": 1}), reads
