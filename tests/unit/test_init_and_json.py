"""`gpufleet init` writes an inventory that validates and plans; every command speaks JSON when asked.

Runs the real CLI (``gpufleet.cli.main``) in-process on files in tmp_path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.fleet import validate_inventory
from gpufleet.fleet.validate import RoleSpecsMissingError, role_variables

CONFIG = Path(__file__).resolve().parents[2] / "models" / "Qwen2.5-1.5B-Instruct" / "config.json"
INIT = [
    "--head", "gpu-head-01=192.0.2.10,10.10.0.10",
    "--worker", "gpu-worker-01=192.0.2.11,10.10.0.11",
    "--model", "Qwen/Qwen2.5-1.5B-Instruct",
    "--gpu", "NVIDIA H800",
    "--gpus-per-node", "2",
    "--gpu-memory-gib", "79.18",
]  # fmt: skip


def init(tmp_path: Path, *extra: str) -> int:
    return main(["init", str(tmp_path / "inv"), *INIT, "--model-config", str(CONFIG), *extra])


def test_init_writes_an_inventory_that_validates_and_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one-model form (--one-instance): one instance over every GPU. Services: test_init_services.py."""
    assert init(tmp_path, "--one-instance") == 0
    result = validate_inventory(tmp_path / "inv")
    assert result.problems == []
    assert result.fleet is not None
    assert [node.name for node in result.fleet.nodes] == ["gpu-head-01", "gpu-worker-01"]
    assert result.fleet.head.name == "gpu-head-01"
    assert result.fleet.total_gpus == 4
    assert result.fleet.serving.tensor_parallel_size == 2  # inside a node
    assert result.fleet.serving.pipeline_parallel_size == 2  # across nodes
    capsys.readouterr()
    assert main(["plan", "-i", str(tmp_path / "inv"), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["tensor_parallel_size"] == 2 and planned["pipeline_parallel_size"] == 2
    assert planned["kv_cache_tokens"] > 0


def test_a_second_init_refuses_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert init(tmp_path) == 0
    hosts = tmp_path / "inv" / "hosts.yml"
    hosts.write_text(hosts.read_text() + "# my edit\n")
    capsys.readouterr()
    assert init(tmp_path) == 2
    assert "found existing file(s)" in capsys.readouterr().err
    assert hosts.read_text().endswith("# my edit\n")
    assert init(tmp_path, "--force") == 0
    assert not hosts.read_text().endswith("# my edit\n")


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--head", "gpu-head-01=999.0.0.1", "expected an IP address"),
        ("--head", "nohost", "expected HOST=IP"),
        ("--model", "no-slash", "expected ORG/NAME"),
        ("--worker", "gpu-head-01=192.0.2.99", "more than once"),
    ],
)
def test_init_refuses_bad_arguments_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, said: str
) -> None:
    args = ["init", str(tmp_path / "inv"), *INIT, option, value, "--json"]
    if option != "--worker":  # replace the good value instead of adding a second
        position = args.index(option)
        args[position + 1 : position + 2] = [value]
    assert main(args) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["exit_code"] == 2
    assert said in out["problems"][0]
    assert not (tmp_path / "inv").exists()


def test_plan_json_refusal_is_one_object_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `plan --json` printed nothing on stdout when it refused."""
    assert main(["plan", "--json", "--model", str(tmp_path / "missing")]) == 2
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out == {"ok": False, "exit_code": 2, "problems": [out["problems"][0]]}
    assert "--model needs" in out["problems"][0]
    assert captured.err == ""


def test_bundle_verify_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bundle", "verify", "--json", str(tmp_path)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and "bundle.lock.yml: missing" in out["problems"][0]


def test_validate_json_on_a_missing_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json", "-i", str(tmp_path / "nothing")]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and out["problems"]


def test_role_specs_that_cannot_be_read_are_an_error_not_a_pass(tmp_path: Path) -> None:
    """From a broken install, a typo in a role variable must not turn into "valid"."""
    with pytest.raises(RoleSpecsMissingError, match=r"argument_specs\.yml: found none"):
        role_variables(tmp_path)


def test_validation_says_so_when_role_specs_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert init(tmp_path) == 0
    monkeypatch.setattr("gpufleet.fleet.validate.project_root", lambda: tmp_path / "empty")
    result = validate_inventory(tmp_path / "inv")
    assert [p.variable for p in result.problems] == ["roles/*/meta/argument_specs.yml"]
    assert "reinstall gpufleet" in str(result.problems[0])
