"""``gpufleet plan`` on the command line: exit codes, the JSON contract, one-line usage errors."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.commands import plan as plan_command
from gpufleet.planner.vllm_archs import VLLM_VERSION

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


# Qwen3-8B (tests/data/models/Qwen3-8B/config.json): 36 layers, 8 KV heads of 128, bf16, untied embeddings,
# max_position_embeddings 40960. K and V, for every layer and KV head, 2 bytes each:
QWEN3_KV_BYTES_PER_TOKEN = 2 * 36 * 8 * 128 * 2  # 147,456
# Parameters: embeddings and lm_head 2 x 151936 x 4096; per layer q and o 4096 x 4096, k and v 4096 x 1024,
# gate, up and down 4096 x 12288, two RMS norms of 4096, q and k norms of 128; the final norm; vLLM's rotary
# cos/sin cache 40960 x 128 in the model dtype. bf16: 2 bytes each.
QWEN3_PARAMETERS = (
    2 * 151936 * 4096
    + 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128)
    + 4096
    + 40960 * 128
)
QWEN3_WEIGHTS_GIB = QWEN3_PARAMETERS * 2 / 2**30  # 15.2662; vLLM 0.24 measured 15.27 (planner_cases.yml)
ESTIMATED_ROWS = {
    "Activation peak",
    "Non-torch memory",
    "CUDA graphs",
    "KV cache per GPU",
    "KV cache blocks of 16 tokens",
    "KV cache tokens",
    "Max concurrency at 16,384 tokens",
}


def test_json_output_is_one_object_with_the_contract_keys(
    gpufleet: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpufleet(*H100, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert set(JSON_KEYS) <= set(data)
    assert (data["errors"], data["warnings"]) == ([], [])
    assert data["kv_bytes_per_token_per_gpu"] == QWEN3_KV_BYTES_PER_TOKEN
    assert data["weights_gib_per_gpu"] == pytest.approx(QWEN3_WEIGHTS_GIB, abs=1e-6)
    assert data["requested_gib_per_gpu"] == pytest.approx(79.18 * 0.9)
    assert data["derived_max_model_len"] == 40960
    # The figures agree with each other: blocks of 16 tokens, concurrency at 16,384 tokens per request,
    # and the KV cache memory holds exactly the blocks (less than one block left over).
    assert data["kv_cache_tokens"] == data["kv_cache_blocks"] * 16 > 0
    assert data["max_concurrency"] == pytest.approx(data["kv_cache_tokens"] / 16384)
    block_bytes = 16 * QWEN3_KV_BYTES_PER_TOKEN
    assert data["kv_cache_blocks"] == int(data["kv_cache_gib_per_gpu"] * 2**30 // block_bytes)
    # What vLLM measured on that H100 (planner_cases.yml): 24,795 blocks. The estimate stays within 10%.
    assert data["kv_cache_blocks"] == pytest.approx(24795, rel=0.10)


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


def table_rows(out: str) -> dict[str, tuple[str, str]]:
    """The summary table's body rows: figure -> (value, basis)."""
    rows = {}
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if len(cells) == 3 and cells[0] != "Figure":
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_table_shows_the_figures_and_marks_the_estimated_ones(
    gpufleet: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpufleet(*H100) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)

    assert rows["Requested per GPU"] == ("71.26 GiB (x 0.9)", "computed")  # 79.18 x 0.9
    assert rows["Weights per GPU"] == (f"{QWEN3_WEIGHTS_GIB:.4f} GiB", "computed")
    assert rows["KV bytes per token per GPU"] == (f"{QWEN3_KV_BYTES_PER_TOKEN:,}", "computed")
    assert rows["Derived max model length"] == ("40,960", "computed")
    assert {figure for figure, (_, basis) in rows.items() if basis == "estimated"} == ESTIMATED_ROWS
    blocks = int(rows["KV cache blocks of 16 tokens"][0].replace(",", ""))
    tokens = int(rows["KV cache tokens"][0].replace(",", ""))
    assert tokens == blocks * 16 > 0
    assert rows["Max concurrency at 16,384 tokens"][0] == f"{tokens / 16384:.2f}x"
    assert out.splitlines()[-1] == "vLLM should start with these settings."
    assert "error:" not in out


def test_table_lists_errors(gpufleet: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpufleet(*H100[:-1], "50000") == 1
    out = capsys.readouterr().out
    text = " ".join(out.split())  # rich wraps long lines
    assert (
        "error: max_model_len: User-specified max_model_len (50000) is greater than the derived "
        "max_model_len (max_position_embeddings=40960" in text
    )
    assert "Fix: set max_model_len to at most 40960" in text
    assert "vLLM should start" not in out


def assert_one_line_usage_error(code: int, capsys: pytest.CaptureFixture[str], *words: str) -> None:
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert "Traceback" not in captured.err
    for word in words:
        assert word in lines[0]


def assert_json_usage_error(code: int, capsys: pytest.CaptureFixture[str], *words: str) -> None:
    """With --json a refusal is one JSON object on stdout: the same one line, nothing on stderr."""
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err == ""
    data = json.loads(captured.out)
    assert set(data) == {"ok", "exit_code", "problems"}
    assert (data["ok"], data["exit_code"], len(data["problems"])) == (False, 2, 1)
    for word in words:
        assert word in data["problems"][0]


def test_missing_model_is_a_usage_error(
    gpufleet: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = gpufleet("--model", str(tmp_path / "nowhere"), *H100[2:])
    assert_one_line_usage_error(code, capsys, "gpufleet plan: --model", "nowhere", "cannot read")


def test_missing_model_with_json_is_one_json_refusal(
    gpufleet: Run, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = gpufleet("--model", str(tmp_path / "nowhere"), *H100[2:], "--json")
    assert_json_usage_error(code, capsys, "--model", "nowhere", "cannot read")


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
    assert_one_line_usage_error(gpufleet(), capsys, "--model", "-i")
    assert_json_usage_error(gpufleet("--json"), capsys, "--model", "-i")


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
    # The example of one instance over two servers (read by ansible-core): Qwen2.5-1.5B, TP 2 over an RTX
    # 3090 (23.69 GiB) and an H800, max_model_len 8192; `gpufleet validate` finds it valid, so the plan has
    # no error.
    code = gpufleet("-i", str(REPO / "inventories" / "examples" / "tp-across-nodes"), "--json")
    data = json.loads(capsys.readouterr().out)
    assert code == 0, data["errors"]
    assert data["errors"] == []
    assert (data["tensor_parallel_size"], data["max_model_len"]) == (2, 8192)
    assert data["gpu_memory_gib"] == 23.69  # the smallest GPU decides
    assert data["gpu_name"] == "NVIDIA GeForce RTX 3090 on gpu-head-01"
    # The plan names the vLLM it predicts; the default image runs that one, so no warning says otherwise.
    assert data["vllm_version"] == VLLM_VERSION
    assert [warning.split(" (", 1)[0] for warning in data["warnings"]] == ["GPUs differ"]
    # 28 layers, K and V, 2 KV heads split over TP 2 = 1 per GPU, head_dim 128, 2 bytes.
    assert data["kv_bytes_per_token_per_gpu"] == 2 * 28 * 1 * 128 * 2


def test_gpufleet_main_runs_plan(capsys: pytest.CaptureFixture[str]) -> None:
    from gpufleet import cli

    assert cli.main(["plan", *H100, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["kv_bytes_per_token_per_gpu"], data["errors"]) == (QWEN3_KV_BYTES_PER_TOKEN, [])
