"""Show a :class:`~gpufleet.planner.Plan`: a rich table that marks estimated figures, or one JSON object."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpufleet.planner.model import Plan

ESTIMATED_MARK = "estimated"
COMPUTED_MARK = "computed"


def json_dict(plan: Plan) -> dict[str, Any]:
    """The object ``gpufleet plan --json`` prints (every field of the plan, GiB as 2**30 bytes)."""
    return plan.to_json_dict()


def plan_json(plan: Plan) -> str:
    return json.dumps(json_dict(plan), indent=2)


def _basis(plan: Plan, field: str) -> str:
    return ESTIMATED_MARK if field in plan.estimated else COMPUTED_MARK


def summary_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """(figure, value, basis) per row of the summary table; basis says computed or estimated."""
    stage = f" (pipeline stage {plan.deciding_stage})" if plan.pipeline_parallel_size > 1 else ""
    rows = [
        ("GPU that decides", f"{plan.gpu_name}, {plan.gpu_memory_gib:.2f} GiB", "given"),
        (
            "Requested per GPU",
            f"{plan.requested_gib_per_gpu:.2f} GiB (x {plan.gpu_memory_utilization})",
            COMPUTED_MARK,
        ),
        (f"Weights per GPU{stage}", f"{plan.weights_gib_per_gpu:.4f} GiB", COMPUTED_MARK),
    ]
    if plan.vision_tower_gib_per_gpu:
        rows.append(("of which vision tower", f"{plan.vision_tower_gib_per_gpu:.4f} GiB", COMPUTED_MARK))
    if plan.offloaded_weights_gib_per_gpu:
        rows.append(
            ("Offloaded to CPU per GPU", f"{plan.offloaded_weights_gib_per_gpu:.4f} GiB", COMPUTED_MARK)
        )
    rows += [
        ("Activation peak", f"{plan.activation_peak_gib:.2f} GiB", _basis(plan, "activation_peak_gib")),
        ("Non-torch memory", f"{plan.non_torch_gib:.2f} GiB", _basis(plan, "non_torch_gib")),
        ("CUDA graphs", f"{plan.cuda_graph_gib:.2f} GiB", _basis(plan, "cuda_graph_gib")),
        ("KV cache per GPU", f"{plan.kv_cache_gib_per_gpu:.2f} GiB", _basis(plan, "kv_cache_gib_per_gpu")),
        ("KV bytes per token per GPU", f"{plan.kv_bytes_per_token_per_gpu:,}", COMPUTED_MARK),
        (
            f"KV cache blocks of {plan.block_size} tokens",
            f"{plan.kv_cache_blocks:,}",
            _basis(plan, "kv_cache_blocks"),
        ),
        ("KV cache tokens", f"{plan.kv_cache_tokens:,}", _basis(plan, "kv_cache_tokens")),
        (
            f"Max concurrency at {plan.max_model_len:,} tokens",
            f"{plan.max_concurrency:.2f}x",
            _basis(plan, "max_concurrency"),
        ),
        ("Derived max model length", f"{plan.derived_max_model_len:,}", COMPUTED_MARK),
    ]
    return rows


def summary_table(plan: Plan) -> Table:
    quant = f", {plan.quantization}" if plan.quantization else ""
    table = Table(
        title=(
            f"vLLM {plan.vllm_version} memory plan: {plan.model_type}, {plan.dtype}{quant}, "
            f"KV {plan.kv_cache_dtype}, TP {plan.tensor_parallel_size} x PP {plan.pipeline_parallel_size}"
        )
    )
    table.add_column("Figure")
    table.add_column("Value", justify="right")
    table.add_column("Basis")
    for figure, value, basis in summary_rows(plan):
        style = "yellow" if basis == ESTIMATED_MARK else None
        table.add_row(figure, value, basis, style=style)
    return table


def stages_table(plan: Plan) -> Table:
    table = Table(title="Per pipeline stage (one GPU of each; estimated columns marked ~)")
    for column in ("Stage", "Layers", "Weights GiB", "~Activation GiB", "~Graphs GiB", "~KV GiB", "~Blocks"):
        table.add_column(column, justify="right")
    for stage in plan.stages:
        table.add_row(
            str(stage.pipeline_rank),
            f"{stage.first_layer}-{stage.end_layer - 1}",
            f"{stage.weights_gib:.3f}",
            f"{stage.activation_peak_gib:.2f}",
            f"{stage.cuda_graph_gib:.2f}",
            f"{stage.kv_cache_gib:.2f}",
            f"{stage.kv_cache_blocks:,}",
        )
    return table


def render(plan: Plan, console: Console) -> None:
    """Print the tables, then every error and warning, one per line."""
    console.print(summary_table(plan))
    if plan.pipeline_parallel_size > 1:
        console.print(stages_table(plan))
    # Text, not markup: messages quote settings and may hold brackets.
    for warning in plan.warnings:
        console.print(Text.assemble(("warning: ", "yellow"), warning))
    for error in plan.errors:
        console.print(Text.assemble(("error: ", "red"), error))
    if not plan.errors:
        console.print("vLLM should start with these settings.", highlight=False)
