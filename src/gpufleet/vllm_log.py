"""Facts from vLLM's start-up log: weights, KV cache, concurrency, the memory breakdown, time to ready.

vLLM states at start-up what it measured; the planner predicted the same figures before deploying. This
module reads the log lines (every format from v0.6 to today, see tests/unit/data/vllm_logs/README.md for
the real excerpts each pattern was written against) and compares them with the plan.

Per-GPU figures are printed once per worker; where the workers differ (pipeline stages hold different
layers) the report keeps the figure that binds: the largest weights and overheads, the smallest KV-cache
memory. Engine-wide figures (KV tokens, concurrency) keep the last value printed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict

_NUM = r"(\d+(?:\.\d+)?)"
_COUNT = r"(\d[\d,]*)"
# A log file may hold several start-ups (a restarted service); only the last one describes what runs.
_START = re.compile(r"vLLM API server version ")
_TIMESTAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)\b")
_READY = re.compile(r"Application startup complete")


class VllmFacts(BaseModel):
    """What vLLM printed about one start-up; None where this version or log level does not say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str | None = None
    weights_gib: float | None = None
    load_seconds: float | None = None
    kv_cache_device: str | None = None
    kv_cache_tokens: int | None = None
    kv_cache_blocks: int | None = None
    cpu_swap_blocks: int | None = None
    max_concurrency: float | None = None
    max_concurrency_request_tokens: int | None = None
    kv_cache_gib: float | None = None
    torch_peak_gib: float | None = None
    non_torch_gib: float | None = None
    non_kv_cache_gib: float | None = None
    requested_gib: float | None = None
    cuda_graph_gib: float | None = None
    cuda_graph_estimate_gib: float | None = None
    engine_init_seconds: float | None = None
    ready_seconds: float | None = None


@dataclass(frozen=True)
class _Rule:
    """One log pattern feeding one fact; for a fact, the first rule that matched anything wins."""

    fact: str
    pattern: re.Pattern[str]
    group: int
    reduce: Callable[[Sequence[float]], float]


def _last(values: Sequence[float]) -> float:
    return values[-1]


def _rule(
    fact: str, pattern: str, group: int = 1, reduce: Callable[[Sequence[float]], float] = _last
) -> _Rule:
    return _Rule(fact, re.compile(pattern), group, reduce)


_WEIGHTS_LINE = r"(?:Model loading took|Loading model weights took) " + _NUM + r" ?Gi?B(?: memory)?"
_RULES = (
    # "Model loading took 2.3185 GiB and 1.02 seconds" (v0.7-0.10), "... 12.66 GiB memory and 31.6 seconds"
    # (v0.11+), "Loading model weights took 67.7229 GB" (v0.6-0.7; the figure is GiB despite the unit).
    _rule("weights_gib", _WEIGHTS_LINE, reduce=max),
    _rule("weights_gib", r"model weights take\s+" + _NUM + r" ?GiB", reduce=max),
    _rule("weights_gib", r"weights memory: " + _NUM + r" ?GiB", reduce=max),
    _rule("load_seconds", _WEIGHTS_LINE + r" and " + _NUM + r" seconds", group=2, reduce=max),
    _rule("kv_cache_tokens", r"\b[A-Z]+ KV cache size: " + _COUNT + r" tokens"),
    _rule("kv_cache_blocks", r"# ?(?!CPU\b)\w+ blocks: (\d+)"),
    _rule("cpu_swap_blocks", r"# ?CPU blocks: (\d+)"),
    _rule("max_concurrency", r"Maximum concurrency for [\d,]+ tokens per request: " + _NUM + "x"),
    _rule("max_concurrency_request_tokens", r"Maximum concurrency for " + _COUNT + " tokens per request"),
    _rule("kv_cache_gib", r"Available KV cache memory: " + _NUM + r" ?GiB", reduce=min),
    _rule("kv_cache_gib", r"the rest of the memory reserved for KV Cache is " + _NUM + r" ?GiB", reduce=min),
    _rule("kv_cache_gib", r"available_kv_cache_memory\s+" + _NUM + r" ?GiB", reduce=min),
    _rule("kv_cache_gib", r"kv_cache_size=" + _NUM + r"GiB", reduce=min),
    _rule("torch_peak_gib", r"torch peak memory increase: " + _NUM + r" ?GiB", reduce=max),
    _rule("torch_peak_gib", r"PyTorch activation peak memory(?: takes)?\s+" + _NUM + r" ?GiB", reduce=max),
    _rule("non_torch_gib", r"non-torch forward increase memory: " + _NUM + r" ?GiB", reduce=max),
    _rule("non_torch_gib", r"non_torch_memory(?: takes\s+|=|\s+)" + _NUM + r" ?GiB", reduce=max),
    _rule("non_kv_cache_gib", r"Total non KV cache memory: " + _NUM + r" ?GiB", reduce=max),
    _rule("requested_gib", r"Requested memory: [\d.]+ \(util\), " + _NUM + r" ?GiB"),
    _rule("requested_gib", r"requested GPU memory: " + _NUM + r" ?GiB"),
    _rule(
        "requested_gib",
        r"the current vLLM instance can use(?: total_gpu_memory \([\d.]+GiB\) x "
        r"gpu_memory_utilization \([\d.]+\) =)?\s+" + _NUM + r" ?GiB",
    ),
    _rule("cuda_graph_gib", r"CUDA graph pool memory: " + _NUM + r" ?GiB \(actual\)", reduce=max),
    _rule("cuda_graph_gib", r"Graph capturing finished in [\d.]+ secs?, took " + _NUM + r" ?GiB", reduce=max),
    # vLLM >= 0.21 (V1 model runner): the estimate it subtracts from the KV budget before capturing.
    _rule("cuda_graph_estimate_gib", r"Estimated CUDA graph memory: " + _NUM + r" ?GiB total", reduce=max),
    _rule("engine_init_seconds", r"init engine \(profile, create kv cache, warmup model\) took " + _NUM),
)
_INTEGER_FACTS = frozenset(
    {"kv_cache_tokens", "kv_cache_blocks", "cpu_swap_blocks", "max_concurrency_request_tokens"}
)
_DEVICE = re.compile(r"\b([A-Z]+) KV cache size: ")
_VERSIONS = (
    re.compile(r"vLLM API server version (\S+)"),
    re.compile(r"Initializing an? (?:V\d )?LLM engine \(v([^)]+)\)"),
)


def parse(log: str | Iterable[str], block_size: int | None = None) -> VllmFacts:
    """Facts of the last start-up in ``log`` (text or lines).

    Old versions print KV-cache blocks, not tokens; ``block_size`` (vLLM's ``--block-size``) turns them
    into tokens when the log does not say.
    """
    lines = _last_start(log.splitlines() if isinstance(log, str) else [str(line) for line in log])
    found: dict[str, float] = {}
    for fact in dict.fromkeys(rule.fact for rule in _RULES):
        for rule in (r for r in _RULES if r.fact == fact):
            values = [
                float(m.group(rule.group).replace(",", ""))
                for line in lines
                if (m := rule.pattern.search(line))
            ]
            if values:
                found[fact] = rule.reduce(values)
                break
    facts: dict[str, object] = {k: int(v) if k in _INTEGER_FACTS else v for k, v in found.items()}
    if "kv_cache_tokens" not in facts and "kv_cache_blocks" in facts and block_size:
        facts["kv_cache_tokens"] = int(found["kv_cache_blocks"]) * block_size
    facts["kv_cache_device"] = _first(_DEVICE, lines)
    facts["version"] = next((v for pattern in _VERSIONS if (v := _first(pattern, lines))), None)
    facts["ready_seconds"] = _ready_seconds(lines)
    return VllmFacts.model_validate(facts)


def _last_start(lines: list[str]) -> list[str]:
    """The lines of the last start-up: from the last API server version line, when there are several."""
    starts = [index for index, line in enumerate(lines) if _START.search(line)]
    return lines[starts[-1] :] if len(starts) > 1 else lines


def _first(pattern: re.Pattern[str], lines: Iterable[str]) -> str | None:
    return next((m.group(1) for line in lines if (m := pattern.search(line))), None)


def _ready_seconds(lines: Sequence[str]) -> float | None:
    """Seconds from the start-up's first timestamped line to the last one before "Application startup
    complete" (after a restart the start-up begins at the API server's version line).

    vLLM's timestamps carry no year and uvicorn's ready line no timestamp at all, hence the neighbours.
    """
    first: datetime | None = None
    last: datetime | None = None
    for line in lines:
        if _READY.search(line):
            return (last - first).total_seconds() if first and last else None
        if m := _TIMESTAMP.search(line):
            stamp = datetime.strptime(f"2000-{m.group(1)}", "%Y-%m-%d %H:%M:%S")
            first = first or stamp
            last = stamp
    return None


class PlanFigures(Protocol):
    """What the planner predicted (gpufleet.planner.core's Plan has these attributes)."""

    @property
    def weights_gib_per_gpu(self) -> float | None: ...
    @property
    def kv_cache_gib_per_gpu(self) -> float | None: ...
    @property
    def kv_cache_tokens(self) -> float | None: ...
    @property
    def max_concurrency(self) -> float | None: ...


@dataclass(frozen=True)
class _Comparison:
    fact: str
    planned: str
    unit: str
    fix: str


_COMPARISONS = (
    _Comparison(
        "weights_gib",
        "weights_gib_per_gpu",
        " GiB",
        "check that gpufleet_model_revision, vllm_service_dtype and vllm_service_quantization "
        "describe the model you deployed, then re-run `gpufleet plan`",
    ),
    _Comparison(
        "kv_cache_gib",
        "kv_cache_gib_per_gpu",
        " GiB",
        "vLLM's non-KV memory (activation peak, non-torch, CUDA graphs) differs from the estimate; "
        "set vllm_service_kv_cache_memory_gib or adjust vllm_service_gpu_memory_utilization",
    ),
    _Comparison(
        "kv_cache_tokens",
        "kv_cache_tokens",
        " tokens",
        "check vllm_service_kv_cache_dtype and vllm_service_block_size, and the KV-cache memory above",
    ),
    _Comparison(
        "max_concurrency",
        "max_concurrency",
        "x",
        "concurrency follows the KV-cache size and vllm_service_max_model_len; see kv_cache_tokens",
    ),
)


def compare(facts: VllmFacts, plan: PlanFigures, tolerance: float = 0.10) -> list[str]:
    """One warning per fact that differs from the plan's prediction by more than ``tolerance``."""
    warnings = []
    for item in _COMPARISONS:
        measured = getattr(facts, item.fact)
        planned = getattr(plan, item.planned, None)
        if measured is None or not planned:
            continue
        change = (measured - planned) / planned
        if abs(change) > tolerance:
            warnings.append(
                f"vLLM start-up log: {item.planned}: found {_show(measured)}{item.unit}; expected "
                f"{_show(planned)}{item.unit} as planned ({change:+.0%}). Fix: {item.fix}"
            )
    return warnings


def _show(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() and value >= 100 else f"{value:,.2f}"
