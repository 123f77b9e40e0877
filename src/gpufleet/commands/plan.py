"""``gpufleet plan``: predict vLLM's start-up memory for a model on some GPUs, and refuse what vLLM would.

Exit 0 when vLLM should start, 1 when the plan has errors (or the inventory has problems), 2 for a usage
error (a missing file, a bad flag value), always with one line on stderr and never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpufleet.commands.output import refuse
from gpufleet.planner import GpuDevice, PlannerInputError, PlanRequest, load_model_config, plan
from gpufleet.planner.model import BLOCK_SIZES

if TYPE_CHECKING:
    from gpufleet.fleet.schema import FleetSpec

# Flags that describe the model and its serving settings; -i takes all of them from the inventory.
REQUIRED_WITH_MODEL = ("gpu_memory_gib", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len")
MODEL_ONLY = (
    *REQUIRED_WITH_MODEL,
    "gpu_name",
    "pipeline_parallel_size",
    "block_size",
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "cpu_offload_gb",
    "max_num_batched_tokens",
    "max_num_seqs",
    "kv_cache_memory_gib",
    "enforce_eager",
    "enable_expert_parallel",
    "limit_mm_per_prompt",
)


class UsageError(Exception):
    """A command line the planner cannot run; the message is one line (exit 2)."""


class UnplannableInventoryError(Exception):
    """An inventory that cannot be planned; the message is one line per problem (exit 1)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="predict vLLM's per-GPU memory (weights, KV cache, concurrency) and refuse what vLLM would",
        description=(
            "Plan from --model and flags, or from an inventory (-i). Exit 0 when vLLM should start, 1 when "
            "the plan has errors, 2 for a usage error. Figures vLLM measures at start-up are estimates and "
            "are marked as such. The plan follows one vLLM release (its title and vllm_version say which); "
            "with -i it warns when the fleet's image runs another."
        ),
    )
    parser.add_argument("--model", metavar="DIR_OR_CONFIG_JSON", help="model directory or its config.json")
    parser.add_argument("-i", "--inventory", metavar="INVENTORY", help="plan an inventory's fleet and model")
    # Values are parsed in run(), so that a bad value gets one line of explanation and exit code 2.
    parser.add_argument(
        "--gpu-memory-gib", metavar="G", help="total memory of one GPU, GiB (as CUDA reports)"
    )
    parser.add_argument(
        "--gpu-name", metavar="NAME", help="GPU name (vLLM's defaults depend on it); optional"
    )
    parser.add_argument("--tensor-parallel-size", metavar="T")
    parser.add_argument("--pipeline-parallel-size", metavar="P", help="default 1")
    parser.add_argument("--gpu-memory-utilization", metavar="U", help="fraction of GPU memory vLLM may use")
    parser.add_argument("--max-model-len", metavar="L")
    parser.add_argument(
        "--block-size", metavar="N", type=int, choices=BLOCK_SIZES, help="1, 8, 16 (default), 32, 64, 128"
    )
    parser.add_argument("--dtype", metavar="DTYPE", help="auto (default), float16, bfloat16, float32")
    parser.add_argument("--kv-cache-dtype", metavar="DTYPE", help="auto (default), fp8, fp8_e4m3, fp8_e5m2")
    parser.add_argument(
        "--quantization", metavar="Q", help="bitsandbytes, fp8, awq, gptq, compressed-tensors, mxfp4"
    )
    parser.add_argument("--cpu-offload-gb", metavar="X", help="GiB of weights per GPU kept in host memory")
    parser.add_argument("--max-num-batched-tokens", metavar="N")
    parser.add_argument("--max-num-seqs", metavar="S")
    parser.add_argument(
        "--kv-cache-memory-gib", metavar="K", help="fixed KV-cache size per GPU (skips profiling)"
    )
    parser.add_argument("--enforce-eager", action="store_true", default=None, help="no CUDA graphs")
    parser.add_argument(
        "--enable-expert-parallel", action="store_true", default=None, help="spread whole experts over ranks"
    )
    parser.add_argument(
        "--limit-mm-per-prompt",
        metavar="JSON",
        help=(
            'items per prompt by modality, as vLLM takes it, e.g. \'{"image": 0, "video": 0}\'; '
            "every modality "
            "at 0: vLLM serves the language model alone, without the vision tower"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        services = _services_fleet(args) if args.inventory else None
        if services is not None:  # services: each replica planned on its own GPUs (plan_services.py)
            from gpufleet.commands.plan_services import run_services  # noqa: PLC0415

            return run_services(*services, as_json=args.json)
        request, caveats = _inventory_request(args) if args.inventory else (_model_request(args), [])
    except UsageError as error:
        return refuse([str(error)], code=2, as_json=args.json, prefix="gpufleet plan: ")
    except UnplannableInventoryError as error:
        return refuse(str(error).splitlines(), code=1, as_json=args.json)
    try:
        result = plan(request)
    except PlannerInputError as error:
        code = 1 if args.inventory else 2
        return refuse([str(error)], code=code, as_json=args.json, prefix="gpufleet plan: ")
    if caveats:  # about the fleet around the plan (its image's vLLM release): shown with the plan's own
        result = result.model_copy(update={"warnings": [*result.warnings, *caveats]})
    from gpufleet.planner import report as plan_report  # noqa: PLC0415  (rich loads only when something is shown)

    if args.json:
        print(plan_report.plan_json(result))
    else:
        from rich.console import Console  # noqa: PLC0415

        plan_report.render(result, Console())
    return 1 if result.errors else 0


def _services_fleet(args: argparse.Namespace) -> tuple[FleetSpec, list[str]] | None:
    """The inventory's fleet and caveats when it lists services (``gpufleet_services``), else None."""
    path = Path(args.inventory)
    if args.model or not path.exists():
        return None  # _inventory_request says what is wrong
    from gpufleet.fleet import load  # noqa: PLC0415
    from gpufleet.fleet.compatibility import fleet_vllm_version_warnings  # noqa: PLC0415
    from gpufleet.problems import InventoryError  # noqa: PLC0415

    fleet = load(path)
    if fleet.spec is None or not fleet.spec.services:
        return None
    given = [_flag(name) for name in MODEL_ONLY if getattr(args, name, None) is not None]
    if given:
        raise UsageError(f"-i takes every setting from the inventory; drop {', '.join(given)}")
    try:
        spec = fleet.require()
    except InventoryError as error:
        raise UnplannableInventoryError(str(error)) from error
    assert fleet.raw is not None
    return spec, fleet_vllm_version_warnings(spec, fleet.raw)


def _inventory_request(args: argparse.Namespace) -> tuple[PlanRequest, list[str]]:
    """The planner's input for the inventory, and the caveats about its fleet (an image of another vLLM)."""
    if args.model:
        raise UsageError("--model and -i/--inventory exclude each other; pass one of them")
    given = [_flag(name) for name in MODEL_ONLY if getattr(args, name, None) is not None]
    if given:
        raise UsageError(f"-i takes every setting from the inventory; drop {', '.join(given)}")
    path = Path(args.inventory)
    if not path.exists():
        raise UsageError(f"-i {path}: no such file or directory; pass an inventory file or directory")
    # InventoryError lives in gpufleet.problems; gpufleet.fleet.inventory raises it. Imported here: ansible.
    from gpufleet.fleet import load  # noqa: PLC0415
    from gpufleet.fleet.compatibility import fleet_vllm_version_warnings  # noqa: PLC0415
    from gpufleet.problems import InventoryError  # noqa: PLC0415

    fleet = load(path)  # read and validated once: the request and the caveats come from the same reading
    try:
        request = fleet.plan_request()
    except InventoryError as error:
        raise UnplannableInventoryError(str(error)) from error
    assert fleet.spec is not None and fleet.raw is not None  # plan_request() raised otherwise
    return request, fleet_vllm_version_warnings(fleet.spec, fleet.raw)


def _model_request(args: argparse.Namespace) -> PlanRequest:
    if not args.model:
        raise UsageError("pass --model DIR_OR_CONFIG_JSON (with its settings) or -i INVENTORY")
    missing = [_flag(name) for name in REQUIRED_WITH_MODEL if getattr(args, name) is None]
    if missing:
        raise UsageError(f"--model needs {', '.join(missing)}")
    try:
        hf_config = load_model_config(Path(args.model))
    except PlannerInputError as error:
        raise UsageError(f"--model: {error}") from error
    gpu = GpuDevice(
        name=args.gpu_name or "GPU",
        memory_gib=_number(args, "gpu_memory_gib", float, minimum=0, open_min=True),
    )
    settings: dict[str, Any] = {
        "tensor_parallel_size": _number(args, "tensor_parallel_size", int, minimum=1),
        "pipeline_parallel_size": _number(args, "pipeline_parallel_size", int, minimum=1, default=1),
        "gpu_memory_utilization": _fraction(args.gpu_memory_utilization),
        "max_model_len": _number(args, "max_model_len", int, minimum=1),
        "block_size": _number(args, "block_size", int, minimum=1, default=16),
        "dtype": args.dtype or "auto",
        "kv_cache_dtype": args.kv_cache_dtype or "auto",
        "quantization": args.quantization,
        "cpu_offload_gb": _number(args, "cpu_offload_gb", float, minimum=0, default=0.0),
        "max_num_batched_tokens": _number(args, "max_num_batched_tokens", int, minimum=1, default=None),
        "max_num_seqs": _number(args, "max_num_seqs", int, minimum=1, default=None),
        "kv_cache_memory_gib": _number(
            args, "kv_cache_memory_gib", float, minimum=0, open_min=True, default=None
        ),
        "enforce_eager": bool(args.enforce_eager),
        "enable_expert_parallel": bool(args.enable_expert_parallel),
        "limit_mm_per_prompt": _mm_limits(args.limit_mm_per_prompt),
    }
    try:
        return PlanRequest(hf_config=hf_config, gpus=(gpu,), **settings)
    except ValidationError as error:  # the checks above should have caught it; still one line
        first = error.errors()[0]
        raise UsageError(f"{first['loc'][0]}: {first['msg']}") from error


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _number(
    args: argparse.Namespace,
    name: str,
    kind: Callable[[str], Any],
    *,
    minimum: float,
    open_min: bool = False,
    default: Any = ...,
) -> Any:
    raw = getattr(args, name)
    if raw is None:
        return default
    what = "a whole number" if kind is int else "a number"
    bound = f"> {minimum:g}" if open_min else f">= {minimum:g}"
    try:
        value = kind(raw)
    except ValueError:
        raise UsageError(f"{_flag(name)}: found {raw!r}; expected {what} {bound}") from None
    if not math.isfinite(value):
        raise UsageError(f"{_flag(name)}: found {raw!r}; expected a finite number {bound}")
    if value < minimum or (open_min and value == minimum):
        raise UsageError(f"{_flag(name)}: found {raw}; expected {what} {bound}")
    return value


def _fraction(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise UsageError(
            f"--gpu-memory-utilization: found {raw!r}; expected a fraction in (0, 1], e.g. 0.9 for 90 %"
        )
    return value


def _mm_limits(raw: str | None) -> dict[str, int] | None:
    """``--limit-mm-per-prompt`` as vLLM reads it: a JSON object of modality -> items (or {"count": N})."""
    if raw is None:
        return None
    expected = 'expected a JSON object of modality -> items per prompt, e.g. \'{"image": 0, "video": 0}\''
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise UsageError(f"--limit-mm-per-prompt: found {raw!r}; {expected}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--limit-mm-per-prompt: found {raw!r}; {expected}")
    limits: dict[str, int] = {}
    for modality, item in value.items():
        count = item.get("count") if isinstance(item, dict) else item
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UsageError(f"--limit-mm-per-prompt: {modality}: found {item!r}; {expected}")
        limits[str(modality)] = count
    return limits
