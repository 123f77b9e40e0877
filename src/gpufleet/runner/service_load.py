"""What the service is doing now, for ``gpufleet status``: requests, KV cache, tokens/s, TTFT percentiles.

Two sources, the better first:

- **Prometheus** (the monitoring stage's, on the head): the status playbook asks it :data:`PROMQL`; rates and
  percentiles cover the last :data:`WINDOW`.
- **vLLM's /metrics**, read twice a few seconds apart when no Prometheus answers: gauges from the second
  read, tokens/s and TTFT percentiles from what changed in between (``window`` says how long); when no request
  finished in between, TTFT percentiles are over everything since vLLM started (``ttft_window`` says so).

Both vLLM metric generations are read: ``vllm:kv_cache_usage_perc`` (v1 engine) and the older
``vllm:gpu_cache_usage_perc``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpufleet.runner.report import ServiceLoad

__all__ = ["PROMQL", "WINDOW", "from_metrics", "from_prometheus", "histogram_quantile", "parse_metrics"]

WINDOW = "5m"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
TTFT = "vllm:time_to_first_token_seconds_bucket"
# The status playbook's Prometheus queries (one instant query each); the keys are ServiceLoad's fields.
PROMQL: dict[str, str] = {
    "requests_running": "sum(vllm:num_requests_running)",
    "requests_waiting": "sum(vllm:num_requests_waiting)",
    "kv_cache_usage": "max(vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)",
    "prompt_tokens_per_s": f"sum(rate(vllm:prompt_tokens_total[{WINDOW}]))",
    "generation_tokens_per_s": f"sum(rate(vllm:generation_tokens_total[{WINDOW}]))",
    "ttft_p50_s": f"histogram_quantile(0.5, sum by (le) (rate({TTFT}[{WINDOW}])))",
    "ttft_p99_s": f"histogram_quantile(0.99, sum by (le) (rate({TTFT}[{WINDOW}])))",
}

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(lines: Iterable[str]) -> Samples:
    """Prometheus' text format: metric name -> [(labels, value)]; comments and unreadable lines skipped."""
    samples: Samples = {}
    for line in lines:
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"] or "")}
        samples.setdefault(match["name"], []).append((labels, value))
    return samples


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets; None without counts.

    Linear interpolation inside the bucket the rank falls in; the +Inf bucket answers with the largest finite
    bound, as Prometheus does.
    """
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]) or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return None


def _sum(samples: Samples, name: str) -> float | None:
    found = samples.get(name)
    return sum(value for _, value in found) if found else None


def _buckets(samples: Samples) -> dict[float, float]:
    """TTFT histogram buckets summed over every label set but ``le``."""
    summed: dict[float, float] = {}
    for labels, value in samples.get(TTFT, []):
        if "le" in labels:
            bound = float(labels["le"])
            summed[bound] = summed.get(bound, 0.0) + value
    return summed


def _rate(before: float | None, after: float | None, seconds: float) -> float | None:
    if before is None or after is None or seconds <= 0:
        return None
    return max(after - before, 0.0) / seconds


def from_metrics(first: Iterable[str], second: Iterable[str], seconds: float) -> ServiceLoad:
    """The load from two reads of vLLM's /metrics ``seconds`` apart (gauges from the second)."""
    before, after = parse_metrics(first), parse_metrics(second)
    kv = next((value for name in KV_USAGE if (value := _max(after, name)) is not None), None)
    old, new = _buckets(before), _buckets(after)
    delta = [(bound, max(count - old.get(bound, 0.0), 0.0)) for bound, count in new.items()]
    recent = any(math.isinf(bound) and count > 0 for bound, count in delta)
    buckets = delta if recent else list(new.items())
    return ServiceLoad(
        source="metrics",
        window=f"{seconds:g}s",
        requests_running=_sum(after, "vllm:num_requests_running"),
        requests_waiting=_sum(after, "vllm:num_requests_waiting"),
        kv_cache_usage=kv,
        prompt_tokens_per_s=_rate(
            _sum(before, "vllm:prompt_tokens_total"), _sum(after, "vllm:prompt_tokens_total"), seconds
        ),
        generation_tokens_per_s=_rate(
            _sum(before, "vllm:generation_tokens_total"), _sum(after, "vllm:generation_tokens_total"), seconds
        ),
        ttft_p50_s=histogram_quantile(0.5, buckets),
        ttft_p99_s=histogram_quantile(0.99, buckets),
        ttft_window=f"{seconds:g}s" if recent else "since vLLM started",
    )


def _max(samples: Samples, name: str) -> float | None:
    found = samples.get(name)
    return max(value for _, value in found) if found else None


def from_prometheus(results: Mapping[str, Any]) -> ServiceLoad:
    """The load from the status playbook's answers to :data:`PROMQL` (field -> Prometheus' result list)."""
    values: dict[str, float | None] = {}
    for field in PROMQL:
        result = results.get(field)
        value: float | None = None
        if isinstance(result, Sequence) and result and isinstance(result[0], Mapping):
            try:
                value = float(result[0]["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                value = None
        values[field] = value if value is None or math.isfinite(value) else None
    return ServiceLoad(source="prometheus", window=WINDOW, ttft_window=WINDOW, **values)
