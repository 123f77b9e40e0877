"""Estimates of what vLLM 0.24 measures at start-up: activation peak, non-torch memory, CUDA-graph memory.

vLLM measures these in its profile run (``gpu_worker.determine_available_memory``), so the planner can only
estimate them. The terms follow what that run does; their constants were fitted on the calibration
start-ups (``tests/unit/test_planner_vllm024.py`` lists which, and checks the validation start-ups):

Which model runner (vLLM 0.24 ``VllmConfig.use_v2_model_runner``): V2 for the architectures in
``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` (Qwen3, Llama, Mistral, DeepSeek-V2, Qwen2-MoE, GraniteMoE), V1
for all others (Qwen2, Qwen3-MoE, Mixtral, Gemma, gpt-oss, ...).

Activation peak (torch peak increase of ``profile_run``: a ``max_num_batched_tokens`` dummy batch, then
the sampler on ``max_num_seqs`` rows of logits with top-k/top-p and a seeded generator)::

    V1:  C_V1 + max_num_seqs x vocab x SAMPLER_V1 + moe_workspace
    V2:  C_V2 + max(max_num_seqs x vocab x SAMPLER_V2, moe_workspace)
    moe_workspace = max_num_batched_tokens x top_k x (2 x moe_intermediate/TP + hidden) x dtype_bytes

The sampler's float32 logits, their sorted copy and indices, probabilities and noise dominate; the dense
forward pass of an 8192-token batch is piecewise-compiled and stays small (C), so the peak does not grow
with the model's size (Qwen2.5 1.5B, 7B and 32B measured 2.17, 2.2 and 2.23 GiB). The fused-MoE
intermediate caches (gate/up output per routed token and the down output) add ``moe_workspace``.

CUDA-graph memory (subtracted from the KV budget by the V1 runner only: ``profile_cudagraph_memory``
returns 0 in the V2 runner, and nothing is captured with ``enforce_eager``)::

    GRAPH_BASE + layers_on_gpu x hidden x GRAPH_PER_LAYER_HIDDEN

Non-torch memory: NON_TORCH_GIB per GPU (CUDA context and cuBLAS workspaces; 0.22-0.24 GiB on every
H100 start-up), plus COLLECTIVES_GIB with several GPUs (measured on vLLM 0.7.2 with TP=2: 0.37-0.40 GiB in
all; no multi-GPU start-up of 0.24 was measured). In vLLM 0.24 that term is NCCL's own buffers (PyNccl), the
custom all-reduce buffers (8 MiB + metadata per rank) and, on by default (VLLM_ALLREDUCE_USE_SYMM_MEM=1), a
torch symmetric-memory all-reduce buffer (Hopper: 64 MiB for 2 ranks, 32 MiB for 4, 64 MiB for 6-8); NCCL's
part depends on its channels and transport, so the constant stays until a TP=2 start-up of 0.24 is measured.

Batching defaults follow ``vllm serve`` (V1, chunked prefill): 8192 batched tokens and 1024 sequences on
GPUs with at least 70 GiB other than the A100, 2048 and 256 elsewhere.
"""

from __future__ import annotations

import math

from gpufleet.planner.arch import GIB, ModelArch

# Fitted on the calibration start-ups (see the module docstring); GiB or bytes per element.
C_V1_GIB = 0.26
SAMPLER_V1 = 13.7  # bytes per logit element (max_num_seqs x vocab)
C_V2_GIB = 0.19
SAMPLER_V2 = 7.5
GRAPH_BASE_GIB = 0.34
GRAPH_PER_LAYER_HIDDEN = 1830  # bytes per layer per hidden unit
NON_TORCH_GIB = 0.23
COLLECTIVES_GIB = 0.35  # vLLM 0.7.2, TP=2 (rank totals 0.37-0.40 GiB); not re-measured on 0.24
LARGE_GPU_GIB = 70
V2_RUNNER_ARCHITECTURES = frozenset(
    {
        "Qwen3ForCausalLM",
        "DeepseekV2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "GraniteMoeForCausalLM",
        "LlamaForCausalLM",
        "MistralForCausalLM",
    }
)


def default_batching(gpu_name: str, gpu_memory_gib: float) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that ``vllm serve`` picks for this GPU."""
    if gpu_memory_gib >= LARGE_GPU_GIB and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


def model_runner(arch: ModelArch) -> str:
    """``v2`` or ``v1``: the model runner vLLM 0.24 picks for this architecture by default."""
    return "v2" if arch.architecture in V2_RUNNER_ARCHITECTURES else "v1"


def moe_workspace_bytes(arch: ModelArch, tp: int, tokens: int, dtype_bytes: int) -> int:
    """Fused-MoE intermediate caches for a batch of ``tokens``: gate/up output and down output per route."""
    if arch.moe is None:
        return 0
    inter = math.ceil(arch.moe.intermediate_size / tp)
    return tokens * arch.moe.top_k * (2 * inter + arch.hidden_size) * dtype_bytes


def sampler_activation_bytes(arch: ModelArch, max_num_seqs: int, runner: str) -> int:
    per_element = SAMPLER_V2 if runner == "v2" else SAMPLER_V1
    return int(max_num_seqs * arch.vocab_size * per_element)


def activation_peak_bytes(
    arch: ModelArch,
    tp: int,
    batching: tuple[int, int],
    dtype_bytes: int,
    *,
    last_stage: bool,
    staging: int,
    runner: str | None = None,
) -> int:
    """Estimated torch activation peak on one GPU while vLLM profiles its largest batch."""
    tokens, max_num_seqs = batching
    runner = runner or model_runner(arch)
    moe = moe_workspace_bytes(arch, tp, tokens, dtype_bytes)
    sampler = sampler_activation_bytes(arch, min(max_num_seqs, tokens), runner) if last_stage else 0
    if runner == "v2":
        return int(C_V2_GIB * GIB) + max(sampler, moe) + staging
    return int(C_V1_GIB * GIB) + sampler + moe + staging


def non_torch_bytes(world_size: int) -> int:
    """Estimated memory outside PyTorch's allocator (CUDA/cuBLAS workspaces, NCCL buffers)."""
    gib = NON_TORCH_GIB + (COLLECTIVES_GIB if world_size > 1 else 0.0)
    return int(gib * GIB)


def cuda_graph_bytes(arch: ModelArch, layers: int, enforce_eager: bool, runner: str | None = None) -> int:
    """The CUDA-graph estimate vLLM subtracts from the KV budget on one GPU (V1 runner only)."""
    if enforce_eager or layers == 0 or (runner or model_runner(arch)) == "v2":
        return 0
    return int(GRAPH_BASE_GIB * GIB) + layers * arch.hidden_size * GRAPH_PER_LAYER_HIDDEN
