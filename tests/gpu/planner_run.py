"""Start real vLLM once per planner case and keep each start-up's DEBUG log (run on the GPU machine).

For each case: a weightless model directory (the case's config.json from tests/unit/data/planner_models plus
a generated tokenizer, see mkmodel.py), then ``vllm serve DIR --load-format dummy`` with the case's flags and
``VLLM_LOGGING_LEVEL=DEBUG``. The memory figures the planner predicts are all printed before CUDA graphs are
captured ("Available KV cache memory", "GPU KV cache size", "Maximum concurrency"), so each server is
stopped a few seconds after its "Maximum concurrency" line, which saves the capture and the API start-up.
Cases run one after another (vLLM's memory profiling assumes it has the GPU to itself), in the order given,
and no case starts once less than ``--reserve`` seconds are left of ``--budget``.

Usage: python3 planner_run.py OUT_DIR [--budget S] [--reserve S] [CASE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "unit" / "data" / "planner_models"
VLLM = "import sys; sys.argv[0] = 'vllm'; from vllm.entrypoints.cli.main import main; main()"
DONE = "Maximum concurrency for"

# name -> (model dir under planner_models, extra `vllm serve` flags). Order = priority.
LEN, UTIL = "--max-model-len", "--gpu-memory-utilization"
MM, NO_MM = "--limit-mm-per-prompt", '{"image": 0, "video": 0}'
EAGER = "--enforce-eager"
TRC = "--trust-remote-code"
PHI4MM = "Phi-4-multimodal-instruct"
CASES: dict[str, tuple[str, list[str]]] = {
    "qwen3-30b-a3b-moe": ("Qwen3-30B-A3B", [LEN, "8192", UTIL, "0.9"]),
    "deepseek-v2-lite-mla": (
        "DeepSeek-V2-Lite",
        [LEN, "8192", UTIL, "0.85"],
    ),
    "qwen3-8b-fp8-block": ("Qwen3-8B-FP8", [LEN, "16384", UTIL, "0.9"]),
    "qwen2.5-7b-awq": (
        "Qwen2.5-7B-Instruct-AWQ",
        [LEN, "8192", UTIL, "0.9"],
    ),
    "gemma-3-1b-sliding": ("gemma-3-1b-it", [LEN, "32768", UTIL, "0.5"]),
    "qwen2.5-32b-kv-fp8": (
        "Qwen2.5-32B-Instruct",
        [LEN, "16384", UTIL, "0.95", "--kv-cache-dtype", "fp8"],
    ),
    "qwen1.5-moe-eager": (
        "Qwen1.5-MoE-A2.7B",
        [LEN, "8192", UTIL, "0.6", "--enforce-eager"],
    ),
    "mixtral-8x7b-fp8": (
        "Mixtral-8x7B-Instruct-v0.1-FP8",
        [LEN, "8192", UTIL, "0.9"],
    ),
    "gpt-oss-20b-mxfp4": ("gpt-oss-20b", [LEN, "16384", UTIL, "0.9"]),
    "qwen2.5-7b-gptq-kv-fp8": (
        "Qwen2.5-7B-Instruct-GPTQ-Int4",
        [LEN, "8192", UTIL, "0.7", "--kv-cache-dtype", "fp8"],
    ),
    "qwen3-30b-a3b-online-fp8": (
        "Qwen3-30B-A3B",
        [LEN, "8192", UTIL, "0.8", "--quantization", "fp8"],
    ),
    "llama-3.1-8b": (
        "Llama-3.1-8B-Instruct",
        [LEN, "32768", UTIL, "0.9"],
    ),
    # Issue 38, on an H200: hybrid state-space models, multimodal models with and without their tower,
    # MXFP4 and AWQ weights.
    "nemotron-nano-9b-v2-hybrid": (
        "NVIDIA-Nemotron-Nano-9B-v2",
        [LEN, "32768", UTIL, "0.9", "--enforce-eager"],
    ),
    "granite-4.0-h-tiny-hybrid-moe": ("granite-4.0-h-tiny", [LEN, "65536", UTIL, "0.9"]),
    "qwen2.5-vl-7b-text-only": ("Qwen2.5-VL-7B-Instruct", [LEN, "32768", UTIL, "0.9", MM, NO_MM]),
    "qwen2.5-vl-7b-images": ("Qwen2.5-VL-7B-Instruct", [LEN, "32768", UTIL, "0.9"]),
    "gemma-3-4b-images": ("gemma-3-4b-it", [LEN, "32768", UTIL, "0.9"]),
    "gemma-3-4b-text-only": ("gemma-3-4b-it", [LEN, "32768", UTIL, "0.9", MM, '{"image": 0}']),
    "gpt-oss-120b-mxfp4": ("gpt-oss-120b", [LEN, "32768", UTIL, "0.9"]),
    "gpt-oss-20b-mxfp4-h200": ("gpt-oss-20b", [LEN, "16384", UTIL, "0.9"]),
    "qwen2.5-7b-awq-h200": ("Qwen2.5-7B-Instruct-AWQ", [LEN, "8192", UTIL, "0.9"]),
    # Issue 38, second round: AWQ on the H200 (eager: the weights and KV cache do not depend on CUDA graphs
    # there, and the V1 runner skips its CUDA-graph estimate), hybrid families other than Nemotron-H.
    "qwen2.5-7b-awq-h200-eager": ("Qwen2.5-7B-Instruct-AWQ", [LEN, "8192", UTIL, "0.9", EAGER]),
    "qwen2.5-32b-awq-h200-eager": ("Qwen2.5-32B-Instruct-AWQ", [LEN, "16384", UTIL, "0.9", EAGER]),
    "falcon-h1-0.5b-hybrid": ("Falcon-H1-0.5B-Instruct", [LEN, "16384", UTIL, "0.9", EAGER]),
    "qwen3-next-24l-hybrid": ("Qwen3-Next-80B-A3B-Instruct-24L", [LEN, "32768", UTIL, "0.9", EAGER]),
    "jamba-v0.1-16l-hybrid": ("Jamba-v0.1-16L", [LEN, "32768", UTIL, "0.9", EAGER]),
    # Validation of the three hybrid families at other settings, predicted before these ran.
    "qwen3-next-24l-hybrid-128k": ("Qwen3-Next-80B-A3B-Instruct-24L", [LEN, "131072", UTIL, "0.85", EAGER]),
    "jamba-v0.1-16l-hybrid-64k": ("Jamba-v0.1-16L", [LEN, "65536", UTIL, "0.8", EAGER]),
    "falcon-h1-0.5b-hybrid-8k": ("Falcon-H1-0.5B-Instruct", [LEN, "8192", UTIL, "0.7", EAGER]),
    # Issue 38, third round: models the planner learned on 2026-12-02, predicted (predictions-round3.json)
    # and committed before these ran. Phi-4-multimodal needs its remote config class (phi4mm_config.py).
    "phi-4-mm-text-only": (
        PHI4MM,
        [LEN, "16384", UTIL, "0.9", EAGER, TRC, MM, '{"image": 0, "video": 0, "audio": 0}'],
    ),
    "nemotron-3-nano-30b-a3b-hybrid-moe": (
        "NVIDIA-Nemotron-3-Nano-30B-A3B",
        [LEN, "16384", UTIL, "0.9", EAGER],
    ),
    "gemma-3-27b-text-only": ("gemma-3-27b-it", [LEN, "16384", UTIL, "0.9", EAGER, MM, '{"image": 0}']),
    "gemma-3-27b-images": ("gemma-3-27b-it", [LEN, "16384", UTIL, "0.9", EAGER]),
    "qwen2-vl-7b-images": ("Qwen2-VL-7B-Instruct", [LEN, "16384", UTIL, "0.9", EAGER]),
    "phi-4-mm-images": (PHI4MM, [LEN, "16384", UTIL, "0.9", EAGER, TRC]),
}


def build(model: str, root: Path) -> str:
    """Model dir with config.json and a tokenizer of exactly vocab_size entries."""
    sys.path.insert(0, str(HERE))
    import mkmodel

    config = json.loads((MODELS / model / "config.json").read_text())
    text = config.get("text_config") if "vocab_size" not in config else None
    # Gemma 3's published text_config leaves vocab_size to Gemma3TextConfig (262,208).
    vocab = int((text or config).get("vocab_size") or 262_208)
    specials = dict(mkmodel.SPECIALS)
    extra = None
    extra_file = MODELS / model / "tokenizer_specials.json"
    if extra_file.exists():  # a multimodal model's processor looks its image tokens up by name
        found = json.loads(extra_file.read_text())
        specials = {int(index): token for index, token in found["specials"].items()}
        extra = found.get("extra_special_tokens")
    elif vocab <= max(specials):  # small vocabularies: the special tokens take the last ids
        specials = {vocab - 3: "<|endoftext|>", vocab - 2: "<|im_start|>", vocab - 1: "<|im_end|>"}
    out = root / model
    out.mkdir(parents=True, exist_ok=True)
    for source in (MODELS / model).glob("*.json"):  # config.json and a multimodal model's processor files
        if source.name != "tokenizer_specials.json":
            (out / source.name).write_text(source.read_text())
    if model == PHI4MM:  # transformers has no phi4mm config class: a stand-in as the remote code
        (out / "configuration_phi4mm.py").write_text((HERE / "phi4mm_config.py").read_text())
        config["auto_map"] = {"AutoConfig": "configuration_phi4mm.Phi4MMConfig"}
        (out / "config.json").write_text(json.dumps(config, indent=2))
    mkmodel.tokenizer(vocab, specials, extra).save_pretrained(out)
    return str(out)


def run_case(name: str, model_dir: Path, flags: list[str], out: Path, limit: float) -> str:
    log_path = out / f"{name}.log"
    cmd = [
        sys.executable,
        "-c",
        VLLM,
        "serve",
        str(model_dir),
        "--load-format",
        "dummy",
        "--port",
        "8011",
        *flags,
    ]
    env = os.environ | {"VLLM_LOGGING_LEVEL": "DEBUG"}
    t0 = time.time()
    with log_path.open("w") as log:
        log.write(f"# {' '.join(cmd[3:])}\n")
        log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        status = "timeout"
        while time.time() - t0 < limit:
            time.sleep(1)
            if DONE in log_path.read_text(errors="replace"):
                time.sleep(3)  # the DEBUG lines around it
                status = "ok"
                break
            if proc.poll() is not None:
                status = f"exited {proc.returncode}"
                break
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=8)
    # Wait until the GPU is free again before the next case profiles it.
    for _ in range(30):
        used = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if used and int(used.split()[0]) < 1500:
            break
        time.sleep(1)
    return f"{name}: {status} in {time.time() - t0:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=float, default=570)
    parser.add_argument("--reserve", type=float, default=75)
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args()
    t0 = time.time()
    names = args.cases or list(CASES)
    root = Path("/root/planner-models")
    args.out.mkdir(parents=True, exist_ok=True)
    pool = ProcessPoolExecutor(max_workers=6)
    dirs = {model: pool.submit(build, model, root) for model in dict.fromkeys(CASES[n][0] for n in names)}
    summary = args.out / "summary.txt"
    for name in names:
        left = args.budget - (time.time() - t0)
        if left < args.reserve:
            line = f"{name}: skipped ({left:.0f} s left)"
        else:
            model, flags = CASES[name]
            model_dir = Path(dirs[model].result())
            line = run_case(
                name, model_dir, flags, args.out, min(left - 10, float(os.environ.get("CASE_LIMIT", "180")))
            )
        print(line, flush=True)
        with summary.open("a") as f:
            f.write(line + "\n")
    pool.shutdown(cancel_futures=True)


if __name__ == "__main__":
    main()
