"""`gpufleet init` writes services (issue 35): each --model a service of replicas that `gpufleet validate`
accepts and `gpufleet plan` places, each replica inside one node and planned on its own GPUs.

Before: init wrote only the one-model form (one instance over every GPU); that form is now --one-instance
(tests/unit/test_init_and_json.py). Runs the real CLI in-process on files in tmp_path.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.cli import main
from gpufleet.fleet import validate_inventory
from gpufleet.fleet.services import not_deployable

CONFIG = Path(__file__).resolve().parents[2] / "models" / "Qwen2.5-1.5B-Instruct" / "config.json"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
FLEET = [
    "--head", "gpu-head-01=192.0.2.10,10.10.0.10",
    "--worker", "gpu-worker-01=192.0.2.11,10.10.0.11",
    "--gpu", "NVIDIA H800",
    "--gpus-per-node", "8",
    "--gpu-memory-gib", "79.18",
]  # fmt: skip
LINE = re.compile(r"^gpufleet init: .+: found .+; expected .+\. Fix: .+$")


def init(tmp_path: Path, *extra: str) -> int:
    """init on two nodes of 8 H800; ``extra`` gives the models (one MODEL with its config when none)."""
    models = [] if "--model" in extra else ["--model", MODEL, "--model-config", str(CONFIG)]
    return main(["init", str(tmp_path / "inv"), *FLEET, *models, *extra])


def planned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["plan", "-i", str(tmp_path / "inv"), "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert result["errors"] == [], result["errors"]
    return result


def services(tmp_path: Path) -> list[dict[str, Any]]:
    written = yaml.safe_load((tmp_path / "inv" / "group_vars" / "gpu_nodes.yml").read_text())
    assert not [name for name in written if name.startswith(("gpufleet_model_", "vllm_service_"))], written
    return list(written["gpufleet_services"])


def test_init_writes_one_service_of_a_replica_per_gpu_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --replicas: replicas auto of one GPU each, 16 on 2 x 8 GPUs, each planned with its KV cache."""
    assert init(tmp_path) == 0
    (service,) = services(tmp_path)
    assert service["name"] == "qwen2-5-1-5b-instruct"  # after the model's NAME, in the schema's rule
    assert service["model"] == {
        "repo": MODEL,
        "revision": "master",
        "dir": "/opt/models/Qwen2.5-1.5B-Instruct",
        "config": os.path.relpath(
            CONFIG, tmp_path / "inv"
        ),  # relative to the inventory, as validate reads it
    }
    assert service["replicas"] == "auto"
    assert service["serving"]["tensor_parallel_size"] == 1
    assert service["serving"]["served_model_name"] == "qwen2.5-1.5b-instruct"
    result = validate_inventory(tmp_path / "inv")
    assert result.problems == [] and result.fleet is not None
    assert not_deployable(result.fleet) == []  # every replica inside one node: a deploy runs it
    plan = planned(tmp_path, capsys)
    assert plan["services"] == [
        {
            "name": "qwen2-5-1-5b-instruct",
            "replicas": 16,
            "kv_cache_tokens": plan["services"][0]["kv_cache_tokens"],
        }
    ]
    assert len(plan["replicas"]) == 16
    assert all(replica["kv_cache_tokens"] > 0 for replica in plan["replicas"]), plan["replicas"]
    assert all(
        [len(member["gpus"]) for member in replica["members"]] == [1] for replica in plan["replicas"]
    ), plan["replicas"]
    assert {replica["node"] for replica in plan["replicas"]} == {"gpu-head-01", "gpu-worker-01"}


def test_replicas_and_tensor_parallel_size_shape_the_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert init(tmp_path, "--replicas", "3", "--tensor-parallel-size", "4") == 0
    (service,) = services(tmp_path)
    assert service["replicas"] == 3 and service["serving"]["tensor_parallel_size"] == 4
    plan = planned(tmp_path, capsys)
    assert len(plan["replicas"]) == 3
    for replica in plan["replicas"]:
        assert [len(member["gpus"]) for member in replica["members"]] == [4], replica  # inside one node
        assert replica["kv_cache_tokens"] > 0, replica


def test_each_model_is_a_service_named_as_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--model repeated: a service each; --replicas and --model-config pair with the models in order."""
    models = ["--model", f"chat={MODEL}", "--model", "Qwen/Qwen2.5-1.5B"]
    configs = ["--model-config", str(CONFIG), "--model-config", str(CONFIG)]
    assert init(tmp_path, *models, *configs, "--replicas", "4", "--replicas", "auto") == 0
    assert [(s["name"], s["model"]["repo"], s["replicas"]) for s in services(tmp_path)] == [
        ("chat", MODEL, 4),
        ("qwen2-5-1-5b", "Qwen/Qwen2.5-1.5B", "auto"),
    ]
    plan = planned(tmp_path, capsys)
    assert [(s["name"], s["replicas"]) for s in plan["services"]] == [("chat", 4), ("qwen2-5-1-5b", 12)]
    assert all(replica["kv_cache_tokens"] > 0 for replica in plan["replicas"])


def test_init_without_a_config_writes_services_validate_accepts(tmp_path: Path) -> None:
    """The config.json is optional, as in the one-model form: the service's memory is then not planned."""
    assert main(["init", str(tmp_path / "inv"), *FLEET, "--model", MODEL]) == 0
    (service,) = services(tmp_path)
    assert "config" not in service["model"]
    result = validate_inventory(tmp_path / "inv")
    assert result.problems == [], result.problems
    assert any("model.config is not set" in warning for warning in result.warnings), result.warnings


# case: (arguments after the fleet's, the option the line names, a word of what it found or expected)
REFUSED: dict[str, tuple[list[str], str, str]] = {
    "replicas not a number": (["--replicas", "many"], "--replicas", "found 'many'"),
    "no replicas": (["--replicas", "0"], "--replicas", "from 1 to 1024"),
    "more replicas than GPUs": (["--replicas", "17"], "--replicas", "at most 16"),
    "replicas given three times for one model": (
        ["--replicas", "1", "--replicas", "2", "--replicas", "3"],
        "--replicas",
        "found 3 values for 1 --model",
    ),
    "tensor parallel size not a number": (
        ["--tensor-parallel-size", "two"],
        "--tensor-parallel-size",
        "'two'",
    ),
    "tensor parallel size 0": (["--tensor-parallel-size", "0"], "--tensor-parallel-size", "found 0"),
    "a replica larger than a node": (["--tensor-parallel-size", "16"], "--tensor-parallel-size", "at most 8"),
    "no GPUs per node": (["--gpus-per-node", "0"], "--gpus-per-node", "found 0"),
    "a service name outside the schema's rule": (["--model", f"Chat={MODEL}"], "--model", "found 'Chat'"),
    "two models named as one service": (
        ["--model", MODEL, "--model", f"other/{MODEL.split('/')[1]}"],
        "--model",
        "more than once",
    ),
    "two models, each as many as fit": (
        ["--model", f"a={MODEL}", "--model", f"b={MODEL}"],
        "--replicas",
        "no GPUs left",
    ),
    "one config for two models": (
        ["--model", f"a={MODEL}", "--model", f"b={MODEL}", "--model-config", str(CONFIG)],
        "--model-config",
        "found 1 for 2 --model",
    ),
    "one instance of two models": (
        ["--one-instance", "--model", f"a={MODEL}", "--model", f"b={MODEL}"],
        "--model",
        "with --one-instance",
    ),
    "one instance with replicas": (
        ["--one-instance", "--replicas", "2"],
        "--replicas",
        "with --one-instance",
    ),
    "a GPU too small for a replica": (["--gpu-memory-gib", "1"], "--gpu-memory-gib", "planner"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_service_values_are_refused_in_one_line_before_any_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    extra, option, word = REFUSED[case]
    assert init(tmp_path, *extra, "--json") == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["exit_code"] == 2, out
    problems = out["problems"]
    assert problems and all(LINE.match(line) for line in problems), problems
    assert any(option in line.split(":")[1] and word in line for line in problems), problems
    assert not (tmp_path / "inv").exists()


@pytest.mark.parametrize(
    ("model", "name"),
    [("Org/true", "true"), ("Org/null", "null"), ("123=Org/x", "123"), ("Org/0x1F", "0x1f")],
)
def test_service_names_yaml_would_read_otherwise_are_written_as_text(
    tmp_path: Path, model: str, name: str
) -> None:
    """A name YAML reads as a boolean, null or a number is quoted: the service is named as given."""
    assert main(["init", str(tmp_path / "inv"), *FLEET, "--model", model]) == 0
    (service,) = services(tmp_path)
    assert service["name"] == name
    result = validate_inventory(tmp_path / "inv")
    assert result.problems == [] and result.fleet is not None
    assert [service.name for service in result.fleet.services] == [name]
