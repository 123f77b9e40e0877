"""``gpufleet plan`` on the command line: exit codes, the JSON contract, one-line usage errors."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.commands import plan as plan_command

DATA = Path(__file__).resolve().parents[1] / "data"
QWEN3 = str(DATA / "models" / "Qwen3-8B")
REPO = Path(__file__).resolve().parents[2]
JSON_KEYS = (
    "weights_gib_per_gpu",
    "kv_bytes_per_token_per_gpu",
    "kv_cache_gib_per_gpu",
    "kv_cache_blocks",
    "kv_cache_tokens",
    "max_concurrency",
    "derived_max_model_len",
    "errors",
    "warnings",
)
# The shared H100 case: vLLM 0.24 started with these settings.
H100 = [
    "--model", QWEN3, "--gpu-memory-gib", "79.18", "--tensor-parallel-size", "1",
    "--gpu-memory-utilization", "0.9", "--max-model-len", "16384",
]  # fmt: skip

Run = Callable[..., int]


@pytest.fixture
def gpufleet(capsys: pytest.CaptureFixture[str]) -> Run:
    """``gpufleet plan ARGS``, through a parser that registers only the plan command."""
    parser = argparse.ArgumentParser(prog="gpufleet")
    plan_command.register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> int:
        args = parser.parse_args(["plan", *argv])
        code: int = args.func(args)
        return code

    return run


def test_json_output_is_one_object_with_the_contract_keys(
    gpufleet: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpufleet(*H100, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert all(key in data for key in JSON_KEYS)
    assert data["errors"] == []
    assert data["kv_bytes_per_token_per_gpu"] == 147456


def test_errors_exit_1_and_are_listed(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    # The shared "too little memory" case: vLLM 0.8.5 refused to start.
    code = gpufleet(
        "--model", QWEN3, "--gpu-memory-gib", "20", "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.12", "--max-model-len", "4096",
        "--quantization", "bitsandbytes", "--json",
    )  # fmt: skip
    assert code == 1
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert any("No available memory for the cache blocks" in error for error in errors)


def test_table_marks_estimated_figures(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpufleet(*H100) == 0
    out = capsys.readouterr().out
    assert "estimated" in out
    assert "computed" in out


def test_table_lists_errors(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpufleet(*H100[:-1], "50000") == 1
    assert "User-specified max_model_len (50000)" in capsys.readouterr().out.replace("\n", " ")


def assert_one_line_usage_error(code: int, capsys: pytest.CaptureFixture[str], *words: str) -> None:
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert "Traceback" not in captured.err
    for word in words:
        assert word in lines[0]


def test_missing_model_is_a_usage_error(
    gpufleet: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = gpufleet("--model", str(tmp_path / "nowhere"), *H100[2:], "--json")
    assert_one_line_usage_error(code, capsys, "--model", "nowhere")


def test_invalid_config_json_is_a_usage_error(
    gpufleet: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text("{not json")
    assert_one_line_usage_error(gpufleet("--model", str(tmp_path), *H100[2:]), capsys, "not valid JSON")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--tensor-parallel-size", "two"),
        ("--tensor-parallel-size", "0"),
        ("--gpu-memory-utilization", "1.5"),
        ("--gpu-memory-gib", "-3"),
        ("--max-model-len", "4k"),
        ("--cpu-offload-gb", "-1"),
    ],
)
def test_bad_flag_value_is_a_one_line_usage_error(
    gpufleet: Run, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    argv = list(H100)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    assert_one_line_usage_error(gpufleet(*argv), capsys, flag)


@pytest.mark.parametrize("flag", ["--dtype", "--kv-cache-dtype", "--quantization"])
def test_unknown_choice_is_a_usage_error(
    gpufleet: Run, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    assert_one_line_usage_error(gpufleet(*H100, flag, "int3"), capsys, "int3")


def test_model_needs_its_settings(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    code = gpufleet("--model", QWEN3, "--gpu-memory-gib", "80")
    assert_one_line_usage_error(
        code, capsys, "--tensor-parallel-size", "--gpu-memory-utilization", "--max-model-len"
    )


def test_model_or_inventory_is_needed(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_usage_error(gpufleet("--json"), capsys, "--model", "-i")


def test_model_and_inventory_exclude_each_other(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    code = gpufleet(*H100, "-i", str(REPO / "inventories" / "prod"))
    assert_one_line_usage_error(code, capsys, "--model", "-i")


def test_inventory_takes_no_model_flags(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    code = gpufleet("-i", str(REPO / "inventories" / "prod"), "--max-model-len", "4096")
    assert_one_line_usage_error(code, capsys, "--max-model-len")


def test_missing_inventory_is_a_usage_error(
    gpufleet: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert_one_line_usage_error(gpufleet("-i", str(tmp_path / "none")), capsys, "none")


@pytest.mark.slow
def test_inventory_is_planned(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    # The example production inventory (read by ansible-core) names Qwen2.5-1.5B on two GPUs.
    code = gpufleet("-i", str(REPO / "inventories" / "prod"), "--json")
    data = json.loads(capsys.readouterr().out)
    assert code == (1 if data["errors"] else 0)
    assert data["kv_bytes_per_token_per_gpu"] == 2 * 28 * 1 * 128 * 2


def test_gpufleet_main_runs_plan(capsys: pytest.CaptureFixture[str]) -> None:
    from gpufleet import cli

    if "plan" not in cli.COMMAND_MODULES:
        pytest.skip("gpufleet.cli does not register the plan command yet")
    assert cli.main(["plan", *H100, "--json"]) == 0
    assert "weights_gib_per_gpu" in json.loads(capsys.readouterr().out)
