"""The planner's hybrid state-space and multimodal rules, without a GPU (issue 38).

What vLLM 0.24 does is read from its code (docs/planner.md names the functions); the start-ups that check the
figures are in test_planner_h200.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.commands import plan as plan_command
from gpufleet.planner import GpuDevice, PlannerInputError, PlannerUnmodelledError, PlanRequest, plan
from gpufleet.planner.arch import GIB, parse_arch
from gpufleet.planner.kvcache import hybrid_block_size

from .test_vllm_service_templates import Role

MODELS = Path(__file__).resolve().parent / "data" / "planner_models"
H200 = GpuDevice(name="NVIDIA H200", memory_gib=150_109_880_320 / GIB)


def config(model: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MODELS / model / "config.json").read_text(encoding="utf-8"))
    return loaded


def granite(**settings: Any) -> Any:
    return plan(
        PlanRequest(hf_config=config("granite-4.0-h-tiny"), gpus=(H200,), max_model_len=65536, **settings)
    )


def test_granite_hybrid_layout() -> None:
    # 4 attention layers (4 KV heads of 128: 2048 bytes per token in bf16), 36 Mamba-2 layers: conv state
    # 3 x (3072 + 2 x 1 x 128) x 2 bytes + SSM state 48 x 64 x 128 x 2 bytes = 806,400 bytes (the SSM state in
    # the model dtype: only Nemotron-H defaults it to float32). 16 x cdiv(806400, 16 x 2048) = 400 tokens.
    arch = parse_arch(config("granite-4.0-h-tiny"))
    assert arch.mamba is not None
    assert arch.mamba.state_bytes(1, 2) == 806_400
    result = granite()
    assert result.errors == []
    assert result.block_size == 400
    assert result.kv_cache_groups == 1 + 9  # groups of 4: one attention group, 36 / 4 Mamba groups
    # A request holds cdiv(65536, 400) blocks in the attention group and one block in each Mamba group.
    assert result.max_concurrency == pytest.approx(result.kv_cache_blocks / (164 + 9))
    # Weights: 64 experts of 512 plus a shared expert of 1024 per layer, tied embeddings: about 6.9 B
    # parameters.
    assert 12.5 < result.weights_gib_per_gpu < 13.5


def test_single_group_is_replicated_over_tensor_parallel_ranks() -> None:
    # n_groups = 1 does not divide TP = 2: vLLM gives every rank tp groups (extra_groups_for_head_shards).
    arch = parse_arch(config("granite-4.0-h-tiny"))
    assert arch.mamba is not None
    assert arch.mamba.groups(2) == 2
    assert arch.mamba.conv_dim(2) == (3072 + 2 * 2 * 128) // 2
    assert granite(tensor_parallel_size=2).errors == []


def test_a_block_size_the_user_sets_is_raised_for_a_hybrid() -> None:
    assert hybrid_block_size(4096, 5_316_608, 16) == 1312
    assert hybrid_block_size(4096, 5_316_608, 64) == 64 * 21  # alignment max(16, block_size)
    assert hybrid_block_size(4096, 1000, 16) == 16


@pytest.mark.parametrize(
    ("model_type", "family"),
    [("lfm2", "LFM2"), ("plamo2", "PLaMo 2"), ("kimi_linear", "Kimi Linear")],
)
def test_other_hybrids_are_unmodelled_not_dense(model_type: str, family: str) -> None:
    hybrid = config("Qwen3-8B-FP8") | {"model_type": model_type}
    with pytest.raises(PlannerUnmodelledError, match=family):
        plan(PlanRequest(hf_config=hybrid, gpus=(H200,), max_model_len=8192))


def test_nemotron_h_moe_blocks_without_experts_are_refused() -> None:
    # MoE blocks (E) are planned from nemotron_h.py (test_planner_heldout.py: Nemotron 3 Nano); without
    # n_routed_experts the config cannot be the model's own.
    moe = config("NVIDIA-Nemotron-Nano-9B-v2")
    moe["hybrid_override_pattern"] = moe["hybrid_override_pattern"].replace("-", "E")
    with pytest.raises(PlannerInputError, match="n_routed_experts"):
        plan(PlanRequest(hf_config=moe, gpus=(H200,), max_model_len=8192))


@pytest.mark.parametrize(("model_type", "family"), [("minimax_text_01", "MiniMax"), ("bamba", "Bamba")])
def test_hybrids_vllm_024_removed_are_refused_as_such(model_type: str, family: str) -> None:
    removed = config("Qwen3-8B-FP8") | {"model_type": model_type}
    # Unmodelled (validate warns and goes on: a fleet pinned to an older vLLM may serve it), saying why.
    with pytest.raises(PlannerUnmodelledError, match=f"{family}.*vLLM removed this family in 0.23.0"):
        plan(PlanRequest(hf_config=removed, gpus=(H200,), max_model_len=8192))


def test_a_multimodal_family_without_the_towers_sizes_is_unmodelled() -> None:
    wrapped = config("gemma-3-4b-it") | {"architectures": ["InternVLForConditionalGeneration"]}
    wrapped["vision_config"] = {"model_type": "intern_vit_6b"}  # no hidden_size / num_hidden_layers
    with pytest.raises(PlannerUnmodelledError, match="InternVLForConditionalGeneration"):
        plan(PlanRequest(hf_config=wrapped, gpus=(H200,), max_model_len=8192))


def test_the_plan_names_the_vllm_version() -> None:
    assert granite().vllm_version == "0.24.0"


@pytest.fixture
def gpufleet_plan(capsys: pytest.CaptureFixture[str]) -> Any:
    parser = argparse.ArgumentParser(prog="gpufleet")
    plan_command.register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> tuple[int, str, str]:
        args = parser.parse_args(["plan", *argv])
        code: int = args.func(args)
        out, err = capsys.readouterr()
        return code, out, err

    return run


QWEN_VL = [
    "--model", str(MODELS / "Qwen2.5-VL-7B-Instruct"), "--gpu-memory-gib", "139.8",
    "--gpu-name", "NVIDIA H200",
    "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--max-model-len", "32768", "--json",
]  # fmt: skip


def test_plan_flag_limit_mm_per_prompt(gpufleet_plan: Any) -> None:
    code, out, _ = gpufleet_plan(*QWEN_VL)
    assert code == 0
    with_tower = json.loads(out)
    code, out, _ = gpufleet_plan(*QWEN_VL, "--limit-mm-per-prompt", '{"image": 0, "video": {"count": 0}}')
    assert code == 0
    without = json.loads(out)
    assert with_tower["vision_tower_gib_per_gpu"] > 1.2
    assert without["vision_tower_gib_per_gpu"] == 0
    assert without["vllm_version"] == "0.24.0"


@pytest.mark.parametrize("value", ["image=0", "[0]", '{"image": -1}', '{"image": "none"}'])
def test_plan_flag_limit_mm_per_prompt_refuses_bad_values(gpufleet_plan: Any, value: str) -> None:
    code, out, err = gpufleet_plan(*QWEN_VL, "--limit-mm-per-prompt", value)
    assert code == 2
    assert "--limit-mm-per-prompt" in out + err  # with --json the refusal is the JSON on stdout


def test_role_renders_limit_mm_per_prompt() -> None:
    role = Role()
    default = role.render("vllm.yaml.j2")
    assert "limit-mm-per-prompt" not in default
    rendered = role.render("vllm.yaml.j2", vllm_service_limit_mm_per_prompt={"image": 0, "video": 0})
    import yaml

    assert yaml.safe_load(rendered)["limit-mm-per-prompt"] == {"image": 0, "video": 0}
    # vllm_service_config still wins, as for every other option.
    both = role.render(
        "vllm.yaml.j2",
        vllm_service_limit_mm_per_prompt={"image": 0},
        vllm_service_config={"limit-mm-per-prompt": {"image": 2}},
    )
    assert yaml.safe_load(both)["limit-mm-per-prompt"] == {"image": 2}


def test_tensor_parallel_sizes_mamba2_refuses() -> None:
    # Nemotron-Nano-9B-v2: TP 5 divides the 40 attention heads but neither the 128 Mamba heads nor the 8
    # Mamba groups, which MambaMixer2 asserts on; TP 2 divides all of them.
    nemotron = config("NVIDIA-Nemotron-Nano-9B-v2")
    result = plan(
        PlanRequest(hf_config=nemotron, gpus=(H200,) * 5, max_model_len=8192, tensor_parallel_size=5)
    )
    assert any("must divide num heads (Mamba heads 128" in error for error in result.errors)
    assert any("num_groups must equal 1 (Mamba groups 8" in error for error in result.errors)
    ok = plan(PlanRequest(hf_config=nemotron, gpus=(H200,) * 2, max_model_len=8192, tensor_parallel_size=2))
    assert ok.errors == []
