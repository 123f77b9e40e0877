"""What vLLM 0.24's "Model loading took X GiB" is made of, tensor by tensor (run on the GPU machine).

For each planner case (tests/gpu/planner_run.py's CASES: the same model dirs and ``vllm serve`` flags) one
Python process builds the engine config from those flags exactly as ``vllm serve --load-format dummy``
does (EngineArgs, usage context OPENAI_API_SERVER) and starts vLLM's own single-process executor
(UniProcExecutor: init_device, then Worker.load_model, which loads under ``max_split_size_mb:20``). Two
hooks, nothing else changed:

- ``DeviceMemoryProfiler.__exit__`` (the context manager that produces the logged figure): right after it
  computed ``consumed_memory``, the allocator snapshot (``torch.cuda.memory._snapshot()``, with the
  allocation history recorded since the runner's ``load_model`` started) is taken;
- the model runner's ``load_model`` (V1 and V2): records memory history around the original, then
  analyses and exits the process (no profiling, no KV cache, no CUDA graphs).

The analysis: every block alive after load that was allocated during load, matched against the storages
of all named_parameters and named_buffers (persistent or not) and of tensors reachable from module
attributes (quant methods, kernels, precision configs); block size vs requested size vs tensor bytes; the
blocks no tensor accounts for, with the vLLM file:line that allocated them.

Processes start together (imports, model dirs) and take the GPU one at a time in the order given (vLLM's
memory check at start-up assumes it has the GPU alone). Writes OUT/weights-probe.log (the summary) and
OUT/weights-probe-raw.tar.gz (each case's full log and a JSON of its blocks and allocation trace).

Usage: python3 weights_probe.py OUT_DIR [--budget S] [CASE ...]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MIB = 2**20
AHEAD = 3
GIB = 2**30
# The three cases the planner got wrong first, then the rest.
ORDER = [
    "gemma-3-1b-sliding",
    "qwen2.5-7b-awq",
    "gpt-oss-20b-mxfp4",
    "llama-3.1-8b",
    "qwen3-8b-fp8-block",
    "deepseek-v2-lite-mla",
    "qwen1.5-moe-eager",
    "mixtral-8x7b-fp8",
    "qwen3-30b-a3b-online-fp8",
    "qwen3-30b-a3b-moe",
    "qwen2.5-32b-kv-fp8",
    # The same load without vLLM's scoped max_split_size_mb:20 (gpu_worker.py), to see what it changes.
    "gemma-3-1b-sliding@nosplit",
    "qwen2.5-7b-awq@nosplit",
]


def gpu_used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return int(out.split()[0]) if out else -1


# --- driver ------------------------------------------------------------------------------------------------


def driver(out: Path, names: list[str], budget: float) -> None:  # noqa: PLR0912
    t0 = time.time()
    work = Path("/root/weights-probe")
    work.mkdir(parents=True, exist_ok=True)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> None:
        for stale in (work / f"ready-{name}", work / f"go-{name}"):
            stale.unlink(missing_ok=True)
        log = (raw / f"{name}.log").open("w")
        procs[name] = subprocess.Popen(
            [sys.executable, __file__, "--child", name, str(raw), str(work)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    summary = out / "weights-probe.log"
    for index, name in enumerate(names):
        # At most AHEAD cases import and build their model dir while another one has the GPU (in case an
        # import creates a CUDA context, which would take memory from the one that loads).
        for upcoming in names[index : index + AHEAD]:
            if upcoming not in procs:
                start(upcoming)
        proc = procs[name]
        line = ""
        while not (work / f"ready-{name}").exists() and proc.poll() is None:
            time.sleep(0.2)
        left = budget - (time.time() - t0)
        if proc.poll() is not None:
            line = f"{name}: exited {proc.returncode} before the GPU phase"
        elif left < 40:
            line = f"{name}: skipped ({left:.0f} s left)"
            proc.kill()
        else:
            for _ in range(60):  # the previous case's memory must be back
                if 0 <= gpu_used_mib() < 1500:
                    break
                time.sleep(0.5)
            started = time.time()
            (work / f"go-{name}").touch()
            try:
                proc.wait(timeout=min(240, left - 20))
                line = f"{name}: exit {proc.returncode} in {time.time() - started:.0f} s (GPU phase)"
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                line = f"{name}: timeout after {time.time() - started:.0f} s"
        print(line, flush=True)
        part = raw / f"{name}.summary.txt"
        with summary.open("a") as f:
            f.write(f"### {line}\n")
            if part.exists():
                f.write(part.read_text())
            f.write("\n")
    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
    with tarfile.open(out / "weights-probe-raw.tar.gz", "w:gz") as tar:
        tar.add(raw, arcname="weights-probe-raw")
    print(f"total {time.time() - t0:.0f} s", flush=True)


# --- child: one case ---------------------------------------------------------------------------------------

STATE: dict[str, Any] = {}


def vllm_frames(frames: list[dict[str, Any]], limit: int = 6) -> list[str]:
    """The innermost frames inside vLLM (or triton_kernels), as path:line (function)."""
    found = []
    for frame in frames:
        name = frame.get("filename", "")
        if "/vllm/" in name and "weights_probe" not in name:
            short = name.split("/vllm/", 1)[1]
            found.append(f"vllm/{short}:{frame.get('line')} ({frame.get('name')})")
        elif "triton_kernels" in name:
            short = name.split("triton_kernels", 1)[1]
            found.append(f"triton_kernels{short}:{frame.get('line')} ({frame.get('name')})")
        if len(found) >= limit:
            break
    return found


def size_rule(nbytes: int) -> int:
    """The block the caching allocator gives a fresh request under max_split_size 20 MiB, if it cuts
    a new segment: 512-byte rounding, segments of 2 MiB (small), 20 MiB (1-10 MiB requests) or the
    request rounded up to 2 MiB (10 MiB and more); a block is split only below max_split_size and when
    more than 1 MiB (large pool) is left."""
    size = max(512, -(-nbytes // 512) * 512)
    if size <= MIB or size < 10 * MIB:
        return size
    segment = -(-size // (2 * MIB)) * (2 * MIB)
    if size >= 20 * MIB or segment - size <= MIB:
        return segment
    return size


def size_class(nbytes: int) -> str:
    if nbytes <= MIB:
        return "a: <=1MiB"
    if nbytes < 10 * MIB:
        return "b: 1-10MiB"
    if nbytes < 20 * MIB:
        return "c: 10-20MiB"
    return "d: >=20MiB"


def pattern(name: str) -> str:
    return re.sub(r"\.\d+\.", ".*.", name)


def walk(obj: Any, name: str, depth: int, seen: set[int], found: list[tuple[str, Any]]) -> None:
    """CUDA tensors reachable from a module attribute (quant methods, kernels, closures)."""
    import torch

    if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, type)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            found.append((name, obj))
        return
    if depth <= 0 or isinstance(obj, torch.nn.Module):
        return
    module = type(obj).__module__ or ""
    if module.startswith(("vllm.config", "transformers", "torch.fx", "logging")):
        return
    try:
        items = _members(obj)
    except Exception:  # an object that refuses to be looked into holds nothing we can name
        return
    for key, value in items:
        walk(value, f"{name}.{key}", depth - 1, seen, found)


def _members(obj: Any) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in list(obj.items())[:2000]]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = [(str(i), v) for i, v in enumerate(list(obj)[:2000])]
    elif isinstance(obj, functools.partial):
        items = [("func", obj.func), ("args", obj.args), ("keywords", obj.keywords)]
    elif callable(obj) and getattr(obj, "__closure__", None):
        items = [(f"<cell{i}>", c.cell_contents) for i, c in enumerate(obj.__closure__ or ()) if _cell_ok(c)]
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).items())
    elif hasattr(obj, "__slots__"):
        items = [(s, getattr(obj, s, None)) for s in obj.__slots__ if isinstance(s, str)]
    return items


def _cell_ok(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def analyse(runner: Any, kind: str, name: str, out: Path, t_load: float) -> None:  # noqa: PLR0912
    import torch

    lines: list[str] = []

    def say(text: str = "") -> None:
        lines.append(text)
        print(text, flush=True)

    snap = STATE.get("snapshot")
    consumed = STATE.get("consumed")
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    with contextlib.suppress(Exception):
        model = model.unwrap()  # CUDAGraphWrapper
    say(f"case {name}: runner {kind}, model {type(model).__name__}, load {t_load:.1f} s")
    say(f"vllm {__import__('vllm').__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    reported = getattr(runner, "model_memory_usage", None)
    say(
        f"Model loading took (exact bytes): {reported} = {reported / GIB:.4f} GiB"
        if reported
        else "no figure"
    )
    say(f"DeviceMemoryProfiler: consumed {consumed}, allocated at exit {STATE.get('allocated_at_exit')}")
    say(f"max_split_size during load (allocator setting seen in the hook): {STATE.get('max_split')}")

    # Storages of parameters, buffers and attribute tensors.
    storages: dict[int, dict[str, Any]] = {}

    def note(tensor: Any, label: str, kind_: str) -> None:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
            return
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        entry = storages.setdefault(
            ptr, {"nbytes": storage.nbytes(), "names": [], "kinds": set(), "t": tensor}
        )
        entry["names"].append(label)
        entry["kinds"].add(kind_)

    for pname, param in model.named_parameters(remove_duplicate=False):
        note(param, pname, "param")
    for bname, buf in model.named_buffers(remove_duplicate=False):
        note(buf, bname, "buffer")
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for mname, module in model.named_modules():
        for key, value in vars(module).items():
            if key in {"_parameters", "_buffers", "_modules"}:
                continue
            walk(value, f"{mname}.{key}" if mname else key, 5, seen, found)
    for label, tensor in found:
        note(tensor, label, "attr")
    param_bytes = sum(e["nbytes"] for e in storages.values() if e["kinds"] & {"param", "buffer"})
    attr_only = sum(e["nbytes"] for e in storages.values() if not e["kinds"] & {"param", "buffer"})
    held = sum(1 for e in storages.values() if e["kinds"] & {"param", "buffer"})
    say(
        f"parameter+buffer storages: {held}, "
        f"{param_bytes} B = {param_bytes / GIB:.4f} GiB; attribute-only tensors: {attr_only} B"
    )
    if reported:
        say(f"figure - parameters/buffers = {(reported - param_bytes) / MIB:.2f} MiB")

    # Parameters by name pattern.
    groups: dict[tuple[str, str, str], list[int]] = collections.defaultdict(list)
    group_kinds: dict[str, set[str]] = collections.defaultdict(set)
    for entry in storages.values():
        t = entry["t"]
        first = pattern(sorted(entry["names"])[0])
        groups[(first, str(t.dtype).replace("torch.", ""), "x".join(map(str, t.shape)))].append(
            entry["nbytes"]
        )
        group_kinds[first] |= entry["kinds"]
    say("\ntensors by name (storage shape of the first name; count x storage bytes; rule block):")
    for (pat, dtype, shape), sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        kinds = ",".join(sorted(group_kinds[pat]))
        say(
            f"  {pat:60s} {kinds:12s} {dtype:10s} {shape:22s} {len(sizes):4d} x {sizes[0]:>12d} "
            f"rule {size_rule(sizes[0]):>12d}"
        )

    if not snap:
        say("no snapshot")
        (out / f"{name}.summary.txt").write_text("\n".join(lines) + "\n")
        return

    # Blocks alive after load.
    blocks = []
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            if block["state"] != "active_allocated":
                continue
            blocks.append(
                {
                    "addr": block["address"],
                    "size": block["size"],
                    "requested": block.get("requested_size", block["size"]),
                    "frames": block.get("frames") or [],
                    "segment": seg["total_size"],
                    "pool": seg.get("segment_type", "?"),
                }
            )
    blocks.sort(key=lambda b: b["addr"])
    new = [b for b in blocks if b["frames"]]
    old = [b for b in blocks if not b["frames"]]
    say(
        f"\nblocks alive: {len(blocks)}; allocated during load: {len(new)}, "
        f"{sum(b['size'] for b in new)} B (requested {sum(b['requested'] for b in new)} B); "
        f"from before: {len(old)}, {sum(b['size'] for b in old)} B"
    )
    ptrs = sorted(storages)
    for b in new:
        i = bisect.bisect_left(ptrs, b["addr"])
        inside = []
        while i < len(ptrs) and ptrs[i] < b["addr"] + b["size"]:
            inside.append(storages[ptrs[i]])
            i += 1
        b["storages"] = inside
        b["tensor_bytes"] = sum(e["nbytes"] for e in inside)
        kinds = set().union(*(e["kinds"] for e in inside)) if inside else set()
        b["class"] = "param" if kinds & {"param", "buffer"} else ("attr" if kinds else "unknown")
        b["names"] = sorted({n for e in inside for n in e["names"]})[:3]

    by_class = collections.defaultdict(lambda: [0, 0, 0, 0])
    for b in new:
        row = by_class[b["class"]]
        row[0] += 1
        row[1] += b["size"]
        row[2] += b["requested"]
        row[3] += b["tensor_bytes"]
    say("by holder: count, block bytes, requested bytes, tensor bytes, block - tensor (MiB)")
    for key, (count, size, requested, tensor) in sorted(by_class.items()):
        say(f"  {key:8s} {count:6d} {size:>14d} {requested:>14d} {tensor:>14d} {(size - tensor) / MIB:10.2f}")

    say(
        "allocator overhead of blocks holding tensors, by request size (block - requested; rule = "
        "fresh-segment prediction):"
    )
    per_class = collections.defaultdict(lambda: [0, 0, 0, 0, 0])
    for b in new:
        if b["class"] == "unknown":
            continue
        row = per_class[size_class(b["requested"])]
        row[0] += 1
        row[1] += b["requested"]
        row[2] += b["size"] - b["requested"]
        row[3] += size_rule(b["requested"]) - b["requested"]
        row[4] += b["size"] == size_rule(b["requested"])
    for key, (count, requested, over, rule_over, hits) in sorted(per_class.items()):
        say(
            f"  {key:12s} {count:6d} blocks, requested {requested / MIB:12.2f} MiB, overhead "
            f"{over / MIB:8.2f} MiB, rule overhead {rule_over / MIB:8.2f} MiB, rule exact for {hits}"
        )
    misses = [b for b in new if b["class"] != "unknown" and b["size"] != size_rule(b["requested"])]
    if misses:
        say(f"blocks whose size differs from the fresh-segment rule ({len(misses)}), first 25:")
        for b in misses[:25]:
            say(
                f"  req {b['requested']:>12d} block {b['size']:>12d} rule {size_rule(b['requested']):>12d} "
                f"segment {b['segment']:>12d} {b['names'][:1]}"
            )

    unknown = [b for b in new if b["class"] != "param"]
    say(
        f"\nblocks held by no parameter or buffer: {len(unknown)}, "
        f"{sum(b['size'] for b in unknown) / MIB:.2f} MiB (by allocating vLLM frame):"
    )
    where = collections.defaultdict(lambda: [0, 0, set(), None])
    for b in unknown:
        frames = vllm_frames(b["frames"])
        key = (b["class"], frames[0] if frames else "?")
        row = where[key]
        row[0] += 1
        row[1] += b["size"]
        row[2].update(b["names"])
        row[3] = row[3] or frames
    for (cls, frame), (count, size, names, frames) in sorted(where.items(), key=lambda kv: -kv[1][1]):
        say(f"  {size / MIB:10.2f} MiB in {count:5d} blocks [{cls}] {frame}")
        say(f"      names: {sorted(names)[:3]}")
        for f in (frames or [])[1:5]:
            say(f"      <- {f}")

    # The raw material: blocks and the allocation trace since load_model started.
    trace = []
    for entry in (snap.get("device_traces") or [[]])[0]:
        frames = vllm_frames(entry.get("frames") or [], limit=2)
        trace.append([entry.get("action"), entry.get("addr"), entry.get("size"), frames[0] if frames else ""])
    raw = {
        "case": name,
        "runner": kind,
        "reported": reported,
        "consumed": consumed,
        "param_bytes": param_bytes,
        "blocks": [
            {k: b[k] for k in ("addr", "size", "requested", "segment", "class", "names", "tensor_bytes")}
            | {"frames": vllm_frames(b["frames"], limit=3)}
            for b in new
        ],
        "trace": trace,
        "segments_before": [
            {
                "addr": seg["address"],
                "size": seg["total_size"],
                "blocks": [[b["address"], b["size"], b["state"]] for b in seg["blocks"]],
            }
            for seg in (STATE.get("before") or {}).get("segments", [])
        ],
    }
    (out / f"{name}.json").write_text(json.dumps(raw))
    say(f"trace entries: {len(trace)}")
    (out / f"{name}.summary.txt").write_text("\n".join(lines) + "\n")


def child(name: str, out: Path, work: Path) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.path.insert(0, str(HERE))
    import planner_run

    case, _, variant = name.partition("@")
    model, flags = planner_run.CASES[case]
    model_dir = planner_run.build(model, Path("/root/planner-models") / name)
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils import mem_utils
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.executor.uniproc_executor import UniProcExecutor
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu import model_runner as gpu_model_runner_v2

    (work / f"ready-{name}").touch()
    while not (work / f"go-{name}").exists():
        time.sleep(0.1)
    print(f"GPU phase starts; GPU used {gpu_used_mib()} MiB", flush=True)

    original_exit = mem_utils.DeviceMemoryProfiler.__exit__

    def exit_hook(self: Any, *exc: Any) -> None:
        original_exit(self, *exc)
        if STATE.get("recording") and "snapshot" not in STATE:
            STATE["consumed"] = self.consumed_memory
            STATE["allocated_at_exit"] = torch.cuda.memory_allocated()
            with contextlib.suppress(Exception):
                STATE["max_split"] = torch.cuda.memory_stats().get("max_split_size")
            STATE["snapshot"] = torch.cuda.memory._snapshot()

    mem_utils.DeviceMemoryProfiler.__exit__ = exit_hook

    def hook(kind: str, original: Any) -> Any:
        def load_model(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                torch.cuda.memory._record_memory_history(
                    enabled="all", context="all", stacks="python", max_entries=3_000_000
                )
            except TypeError:
                torch.cuda.memory._record_memory_history(True, max_entries=3_000_000)
            STATE["recording"] = True
            STATE["before"] = torch.cuda.memory._snapshot()
            t0 = time.time()
            original(self, *args, **kwargs)
            t_load = time.time() - t0
            try:
                analyse(self, kind, name, out, t_load)
            except Exception:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

        return load_model

    gpu_model_runner.GPUModelRunner.load_model = hook("v1", gpu_model_runner.GPUModelRunner.load_model)
    v2 = gpu_model_runner_v2.GPUModelRunner
    v2.load_model = hook("v2", v2.load_model)
    if variant == "nosplit":
        from vllm.v1.worker import gpu_worker

        gpu_worker.Worker._scoped_allocator_max_split = lambda self, max_split_size_mb: (
            contextlib.nullcontext()
        )

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", model_dir, "--load-format", "dummy", *flags])
    engine_args = EngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    print(f"use_v2_model_runner={getattr(config, 'use_v2_model_runner', None)}", flush=True)
    UniProcExecutor(config)
    print("load_model returned without the hook", flush=True)
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--budget", type=float, default=540)
    parser.add_argument("--child", nargs=3, metavar=("CASE", "RAW_DIR", "WORK_DIR"))
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args()
    if args.child:
        name, raw, work = args.child
        child(name, Path(raw), Path(work))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    driver(args.out, args.cases or ORDER, args.budget)


if __name__ == "__main__":
    main()
