"""gpufleet status' load figures: vLLM's /metrics read twice (real reads of the lab's vLLM 0.32 CPU build, 5 s
apart with 4 chat completions in between) and Prometheus' answers (a real answer of the lab's Prometheus)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpufleet.runner.report import NodeState, StageResult, StatusReport
from gpufleet.runner.service_load import (
    PROMQL,
    from_metrics,
    from_prometheus,
    histogram_quantile,
    parse_metrics,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "metrics"
FIRST = (DATA / "vllm-0.32-cpu-first.txt").read_text(encoding="utf-8").splitlines()
SECOND = (DATA / "vllm-0.32-cpu-second.txt").read_text(encoding="utf-8").splitlines()


def test_the_text_format_is_read_with_labels_and_comments_skipped() -> None:
    samples = parse_metrics(SECOND)

    assert samples["vllm:generation_tokens_total"] == [({"engine": "0", "model_name": "tiny"}, 160.0)]
    assert len(samples["vllm:time_to_first_token_seconds_bucket"]) == 23  # 0.001 s to 2560 s and +Inf
    assert not any(name.startswith("#") for name in samples)


def test_two_reads_give_rates_and_the_ttft_percentiles_of_the_requests_in_between() -> None:
    load = from_metrics(FIRST, SECOND, 5.0)

    assert (load.source, load.window, load.ttft_window) == ("metrics", "5s", "5s")
    assert (load.requests_running, load.requests_waiting, load.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert load.prompt_tokens_per_s == pytest.approx((185 - 117) / 5)
    assert load.generation_tokens_per_s == pytest.approx((160 - 96) / 5)
    # The 4 new requests' buckets (second - first): <=0.01: 1, <=0.02: 2, <=0.04: 3, <=0.06: 4.
    # p50: rank 2 falls in (0.01, 0.02] at its top; p99: rank 3.96 is 96 % into (0.04, 0.06].
    assert load.ttft_p50_s == pytest.approx(0.02)
    assert load.ttft_p99_s == pytest.approx(0.04 + 0.02 * 0.96)


def test_without_new_requests_the_percentiles_cover_everything_since_vllm_started() -> None:
    load = from_metrics(SECOND, SECOND, 5.0)

    assert load.ttft_window == "since vLLM started"
    assert load.generation_tokens_per_s == 0.0
    # 10 requests in all: <=0.01: 3, <=0.02: 6 -> rank 5 is 2/3 into (0.01, 0.02]
    assert load.ttft_p50_s == pytest.approx(0.01 + 0.01 * 2 / 3)


def test_the_older_kv_cache_metric_is_read_when_the_newer_is_absent() -> None:
    older = [line.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") for line in SECOND]
    older = [
        line.replace('model_name="tiny"} 0.0', 'model_name="tiny"} 0.25') if "gpu_cache" in line else line
        for line in older
    ]

    assert from_metrics(FIRST, older, 5.0).kv_cache_usage == 0.25


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, [(0.1, 0.0), (0.2, 10.0), (math.inf, 10.0)], 0.15),  # interpolated in (0.1, 0.2]
        (0.5, [(0.1, 10.0), (math.inf, 10.0)], 0.05),  # the first bucket starts at 0
        (0.99, [(0.1, 1.0), (math.inf, 10.0)], 0.1),  # in the +Inf bucket: the largest finite bound
        (0.5, [(0.1, 0.0), (math.inf, 0.0)], None),  # no observations
        (0.5, [(0.1, 3.0)], None),  # no +Inf bucket: not a histogram
    ],
)
def test_histogram_quantile_follows_prometheus(
    q: float, buckets: list[tuple[float, float]], expected: float | None
) -> None:
    assert histogram_quantile(q, buckets) == (pytest.approx(expected) if expected is not None else None)


def test_prometheus_answers_become_the_load_and_nan_becomes_unknown() -> None:
    answer = json.loads((DATA / "prometheus-answer-rate.json").read_text(encoding="utf-8"))["data"]["result"]
    nan = [{"metric": {}, "value": [1.0, "NaN"]}]
    results = {field: [] for field in PROMQL} | {"generation_tokens_per_s": answer, "ttft_p50_s": nan}

    load = from_prometheus(results)

    assert (load.source, load.window) == ("prometheus", "5m")
    assert load.generation_tokens_per_s == float(answer[0]["value"][1])
    assert load.ttft_p50_s is None and load.requests_running is None


def test_nodes_that_run_different_images_are_a_problem() -> None:
    stage = StageResult(name="status", status="ok", seconds=1.0)
    nodes = (
        NodeState(host="n1", container="running", image_id="sha256:" + "a" * 64, model_revision="c1"),
        NodeState(host="n2", container="running", image_id="sha256:" + "b" * 64, model_revision="c1"),
    )

    problems = StatusReport(ok=True, stage=stage, nodes=nodes).problems

    assert problems == ["the nodes run different image ids: n1 sha256:aaaaaaaaaaaa, n2 sha256:bbbbbbbbbbbb"]


def test_status_is_not_ok_when_the_nodes_run_different_images(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpufleet.runner import api

    stage = StageResult(name="status", status="ok", seconds=1.0)
    nodes = {
        name: {"container": "running", "container_unit": "active", "vllm_unit": "active", "image_id": image}
        for name, image in (("n1", "sha256:" + "a" * 64), ("n2", "sha256:" + "b" * 64))
    }
    facts = {
        "gpufleet_vllm_ready": ("n1", True),
        "gpufleet_ray_nodes_alive": ("n1", 2),
        "gpufleet_ray_nodes_expected": ("n1", 2),
        "gpufleet_nodes": ("n1", nodes),
    }
    monkeypatch.setattr(api, "run_stages", lambda *args, **kwargs: ([stage], facts))
    (tmp_path / "hosts.yml").write_text("all: {}\n", encoding="utf-8")

    report = api.status(tmp_path / "hosts.yml")

    assert report.vllm_ready and report.ray_nodes_alive == 2
    assert not report.ok and report.problems
