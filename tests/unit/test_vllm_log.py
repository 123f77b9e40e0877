"""vLLM start-up log parsing over real excerpts (sources in data/vllm_logs/README.md), and plan comparison."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufleet.vllm_log import VllmFacts, compare, parse

LOGS = Path(__file__).parent / "data" / "vllm_logs"

# Every figure below was read off the log file by hand; derived token counts were checked against the
# concurrency vLLM printed (tokens / tokens-per-request = concurrency).
EXPECTED: dict[str, dict[str, Any]] = {
    "v0.6.4_v0_profiling_results.log": {
        "weights_gib": 14.9888,
        "kv_cache_blocks": 1478,
        "cpu_swap_blocks": 2048,
        "kv_cache_tokens": 23648,  # 1478 x 16, the figure vLLM itself prints in the error that follows
        "max_concurrency": 0.82,
        "max_concurrency_request_tokens": 29000,
        "kv_cache_gib": 2.89,
        "non_torch_gib": 0.35,
    },
    "v0.6.5_profiling_table.log": {
        "weights_gib": 14.96,
        "kv_cache_gib": 53.29,
        "torch_peak_gib": 1.26,
        "non_torch_gib": 1.79,
        "requested_gib": 71.29,
    },
    "v0.7.0_v1_gpu_blocks.log": {
        "weights_gib": 67.7229,
        "kv_cache_blocks": 1381,
        "kv_cache_tokens": 22096,
        "max_concurrency": 10.79,
        "max_concurrency_request_tokens": 2048,
    },
    "v0.7.3_v1_kv_cache_tokens.log": {
        "kv_cache_device": "GPU",
        "kv_cache_tokens": 2042016,
        "max_concurrency": 997.08,
        "max_concurrency_request_tokens": 2048,
    },
    "v0.8_v0_cuda_blocks.log": {
        "weights_gib": 1.12,
        "kv_cache_blocks": 36184,
        "cpu_swap_blocks": 2340,
        "kv_cache_tokens": 578944,
        "max_concurrency": 70.67,
        "max_concurrency_request_tokens": 8192,
        "kv_cache_gib": 61.84,
        "torch_peak_gib": 0.23,
        "non_torch_gib": 0.16,
        "requested_gib": 63.35,
        "cuda_graph_gib": 0.13,
        "engine_init_seconds": 5.13,
    },
    "v0.8.5_v0_pipeline_parallel.log": {
        # Two pipeline ranks: the heavier rank's weights and peak, the smaller rank's KV memory.
        "weights_gib": 10.80,
        "torch_peak_gib": 1.77,
        "kv_cache_gib": 14.26,
        "non_torch_gib": 0.33,
        "kv_cache_blocks": 7299,
        "cpu_swap_blocks": 2048,
        "kv_cache_tokens": 116784,
        "max_concurrency": 2.34,
        "max_concurrency_request_tokens": 50000,
        "requested_gib": 26.66,
    },
    "v0.10.0_v1_debug_tp4.log": {
        "weights_gib": 55.13,
        "kv_cache_gib": 7.07,
        "torch_peak_gib": 5.62,
        "non_torch_gib": 2.04,
        "non_kv_cache_gib": 62.79,
        "requested_gib": 69.86,
    },
    "v0.10.1_v1_debug_full.log": {
        "version": "0.1.dev8168+g475c1a0",
        "weights_gib": 2.3185,
        "load_seconds": 1.022598,
        "kv_cache_device": "GPU",
        "kv_cache_tokens": 1215552,
        "max_concurrency": 9.27,
        "max_concurrency_request_tokens": 131072,
        "kv_cache_gib": 37.10,
        "torch_peak_gib": 0.45,
        "non_torch_gib": 0.02,
        "non_kv_cache_gib": 2.78,
        "requested_gib": 39.88,
        "engine_init_seconds": 7.70,
        "ready_seconds": 27.0,  # 10:17:02 (first line) to 10:17:29 (last stamp before startup complete)
    },
    "v0.11_v1_tp2.log": {
        "kv_cache_device": "GPU",
        "kv_cache_tokens": 75840,
        "max_concurrency": 2.48,
        "max_concurrency_request_tokens": 120000,
        "kv_cache_gib": 2.30,
    },
    "ray_multinode_workers.log": {"weights_gib": 13.2, "load_seconds": 148.493862},
    "v0.2x_model_runner_v2.log": {"weights_gib": 7.64, "load_seconds": 32.969258},
    "v0.32_cpu_merged_line.log": {
        "kv_cache_device": "CPU",
        "kv_cache_tokens": 1048576,
        "max_concurrency": 2048.0,
        "max_concurrency_request_tokens": 512,
    },
}


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def test_every_fixture_has_expectations() -> None:
    assert sorted(EXPECTED) == sorted(path.name for path in LOGS.glob("*.log"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_reads_every_fact_of_a_real_log(name: str) -> None:
    facts = parse(read(name), block_size=16)

    assert facts.model_dump(exclude_none=True) == pytest.approx(EXPECTED[name])


def test_blocks_stay_blocks_without_a_block_size() -> None:
    facts = parse(read("v0.7.0_v1_gpu_blocks.log"))

    assert (facts.kv_cache_blocks, facts.kv_cache_tokens) == (1381, None)


def test_parse_accepts_lines_as_well_as_text() -> None:
    text = read("v0.10.1_v1_debug_full.log")

    assert parse(text.splitlines()) == parse(text)


def test_a_restarted_service_reports_only_its_last_start_up() -> None:
    first = read("v0.10.1_v1_debug_full.log").splitlines()
    version_line = next(line for line in first if "vLLM API server version" in line)
    restarted = [*first, version_line, *read("v0.11_v1_tp2.log").splitlines()]

    facts = parse(restarted)

    assert facts.kv_cache_tokens == 75840
    assert facts.weights_gib is None  # the second start-up's excerpt has no loading line
    assert facts.ready_seconds is None


def test_a_log_without_facts_gives_empty_facts() -> None:
    assert parse("Traceback (most recent call last):\nRuntimeError: CUDA error") == VllmFacts()


@dataclass(frozen=True)
class Plan:
    weights_gib_per_gpu: float | None
    kv_cache_gib_per_gpu: float | None
    kv_cache_tokens: int | None
    max_concurrency: float | None


MEASURED = parse(read("v0.10.1_v1_debug_full.log"))


def test_compare_is_quiet_within_ten_percent() -> None:
    plan = Plan(
        weights_gib_per_gpu=2.4, kv_cache_gib_per_gpu=35.0, kv_cache_tokens=1_150_000, max_concurrency=9.9
    )

    assert compare(MEASURED, plan) == []


def test_compare_warns_for_each_fact_off_by_more_than_ten_percent() -> None:
    plan = Plan(
        weights_gib_per_gpu=2.0, kv_cache_gib_per_gpu=42.0, kv_cache_tokens=1_000_000, max_concurrency=9.27
    )

    warnings = compare(MEASURED, plan)

    assert len(warnings) == 3
    assert warnings[0].startswith("vLLM start-up log: weights_gib_per_gpu: found 2.32 GiB; expected 2.00 GiB")
    assert "(+16%)" in warnings[0]
    assert "kv_cache_gib_per_gpu: found 37.10 GiB; expected 42.00 GiB as planned (-12%)" in warnings[1]
    assert "kv_cache_tokens: found 1,215,552 tokens; expected 1,000,000 tokens" in warnings[2]
    assert all("Fix: " in warning for warning in warnings)


def test_compare_skips_what_either_side_does_not_know() -> None:
    plan = Plan(weights_gib_per_gpu=None, kv_cache_gib_per_gpu=0.0, kv_cache_tokens=10, max_concurrency=1.0)
    facts = VllmFacts(kv_cache_tokens=None, max_concurrency=1.05)

    assert compare(facts, plan) == []
