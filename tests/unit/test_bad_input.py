"""Bad numbers, files and flags end in one line and the right exit code: no traceback, no wrong acceptance.

Before (issue 13, "bad input"): `plan --gpu-memory-gib inf` was an OverflowError traceback, a non-UTF-8
config.json or manifest a UnicodeDecodeError, `bundle build --out FILE` a FileExistsError; a config.json
with NaN and `plan --block-size 7` (which validate refuses) were planned, `vllm_service_port: true` was
"valid" (pydantic takes true as 1).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpufleet.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "models" / "Qwen2.5-1.5B-Instruct" / "config.json"
PLAN = ["plan", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--max-model-len", "4096"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's own refusals
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.err + captured.out


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--gpu-memory-gib", "inf"), ("--gpu-memory-gib", "nan"), ("--cpu-offload-gb", "nan"),
     ("--cpu-offload-gb", "inf"), ("--kv-cache-memory-gib", "inf"), ("--gpu-memory-utilization", "nan")],
)  # fmt: skip
def test_plan_refuses_non_finite_numbers(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*PLAN, "--model", str(CONFIG), "--gpu-memory-gib", "80"]
    position = args.index(flag) if flag in args else len(args)
    args[position : position + 2] = [flag, value]
    code, out = run(args, capsys)
    assert code == 2 and f"{flag}: found {value!r}" in out, out


def test_plan_takes_only_the_block_sizes_vllm_and_validate_take(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run([*PLAN, "--model", str(CONFIG), "--gpu-memory-gib", "80", "--block-size", "7"], capsys)
    assert code == 2 and "invalid choice: 7" in out
    code, _ = run([*PLAN, "--model", str(CONFIG), "--gpu-memory-gib", "80", "--block-size", "32"], capsys)
    assert code == 0


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfe{}", "bytes that are not UTF-8 at offset 0"),
        (
            CONFIG.read_bytes().replace(b'"rms_norm_eps": 1e-06', b'"rms_norm_eps": NaN'),
            "NaN is not a number",
        ),
        (
            CONFIG.read_bytes().replace(b'"rms_norm_eps": 1e-06', b'"rms_norm_eps": Infinity'),
            "Infinity is not",
        ),
        (b"[1, 2]", "found a JSON list; expected a JSON object"),
        (b"{", "not valid JSON"),
    ],
)
def test_plan_refuses_a_bad_config_json(
    content: bytes, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert b"NaN" not in content or b'"rms_norm_eps": NaN' in content  # the replacement took place
    config = tmp_path / "config.json"
    config.write_bytes(content)
    code, out = run([*PLAN, "--model", str(config), "--gpu-memory-gib", "80", "--json"], capsys)
    refusal = json.loads(out)
    assert code == 2 and refusal["ok"] is False and said in refusal["problems"][0], out


def test_bundle_build_refuses_an_out_that_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "afile"
    target.write_text("mine")
    code, out = run(["bundle", "build", "--out", str(target)], capsys)
    assert code == 2 and "found a file; expected a bundle directory" in out
    assert target.read_text() == "mine"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfe", "bytes that are not UTF-8"),
        (b"- a\n", "found list; expected a mapping"),
        (b"a: [", "valid YAML"),
    ],
)
def test_bundle_build_refuses_a_bad_manifest(
    content: bytes, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "manifest.yml"
    manifest.write_bytes(content)
    code, out = run(["bundle", "build", "--manifest", str(manifest), "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and said in out, out
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("vllm_service_port", "true"),
        ("vllm_service_max_model_len", "false"),
        ("vllm_service_block_size", "true"),
        ("vllm_service_gpu_memory_utilization", ".nan"),
        ("vllm_service_max_model_len", ".inf"),
    ],
)
def test_validate_refuses_booleans_and_non_finite_numbers(
    variable: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "inv"
    shutil.copytree(REPO / "inventories" / "prod", inventory)
    group_vars = inventory / "group_vars" / "gpu_nodes.yml"
    lines = [line for line in group_vars.read_text().splitlines() if not line.startswith(f"{variable}:")]
    lines = [line.replace("../../models/", f"{REPO}/models/") for line in lines]
    group_vars.write_text("\n".join([*lines, f"{variable}: {value}", ""]))
    code, out = run(["validate", "-i", str(inventory)], capsys)
    assert code == 1 and f"{variable}: found " in out, out
