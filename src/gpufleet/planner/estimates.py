"""Estimates of what vLLM measures at start-up: activation peak, non-torch memory, CUDA-graph memory.

vLLM measures these in a profiling pass, so the planner can only estimate them. The formulas are simple,
tied to the quantities that drive them, and calibrated on the shared cases (``tests/data/planner_cases.yml``):

Activation peak (per GPU), in bytes::

    max_num_batched_tokens x dtype_bytes x (4 x hidden + qkv_out/TP + 3 x intermediate/TP)   (forward)
  + min(max_num_seqs, max_num_batched_tokens) x vocab x 14        (sampler; last pipeline stage only)
  + the largest layer's offloaded bytes                           (cpu_offload_gb copies a layer back)

The forward term counts the hidden-size tensors alive in a layer (residual, normed input, attention
output, MLP output), the fused QKV output and the gate/up output plus the activated half. It predicts
0.079 GiB for Qwen2.5-1.5B, TP=2, 2048 tokens, where rank 1 of vLLM 0.7.2 measured 0.09 GiB (rank 1 runs
no sampler). The sampler term counts the logits in the model dtype (2 bytes), their float32 copy, the
float32 probabilities and the float32 exponential noise of random sampling (3 x 4 bytes). It is
conservative by design: vLLM 0.24's V1 runner measured 2.17 GiB for Qwen2.5-1.5B (predicted 2.56), its
V2 runner 1.29 GiB for Qwen3-8B (predicted 2.93); vLLM 0.7.2's V0 sampler, which sorts for top-p/top-k,
measured 1.39 GiB on rank 0 (predicted 0.59).

Non-torch memory: 0.25 GiB per GPU (vLLM 0.24 measured 0.22-0.23 GiB on one H100), plus 0.35 GiB when
the deployment spans several GPUs, for NCCL and custom all-reduce buffers (vLLM 0.7.2, TP=2: 0.37-0.40 GiB;
vLLM 0.8.5 counted the CUDA context too, about 1 GiB more with TP=2).

CUDA-graph memory: 0 with ``enforce_eager``; otherwise
``layers_on_gpu x min(512, 2 x max_num_seqs) x hidden x dtype_bytes x 9`` (the largest captured batch's
hidden-size buffers, about nine per layer). Qwen2.5-1.5B: 0.37 GiB predicted, 0.39 GiB estimated and 0.42
GiB taken by vLLM 0.24; Qwen3-8B: 1.27 GiB predicted, 1.00 GiB taken. Newer vLLM (V1 runner) subtracts
its estimate from the KV budget; older engines and the V2 runner capture the graphs above the budget.
The planner always subtracts it: the memory is used either way.

Batching defaults follow ``vllm serve`` (V1, chunked prefill): 8192 batched tokens and 1024 sequences on
GPUs with at least 70 GiB other than the A100, 2048 and 256 elsewhere.

With these, the KV cache predicted for the shared cases lies between -6 % and +8 % of what vLLM reported
(the table is in :mod:`gpufleet.planner.core`'s docstring); the tests hold it to 12 %.
"""

from __future__ import annotations

import math

from gpufleet.planner.arch import GIB, ModelArch, heads_per_rank

NON_TORCH_GIB = 0.25
COLLECTIVES_GIB = 0.35
LOGIT_BYTES = 14  # model-dtype logits + float32 logits, probabilities and sampling noise
GRAPH_BUFFERS_PER_LAYER = 9
GRAPH_MAX_CAPTURE = 512
LARGE_GPU_GIB = 70


def default_batching(gpu_name: str, gpu_memory_gib: float) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that ``vllm serve`` picks for this GPU."""
    if gpu_memory_gib >= LARGE_GPU_GIB and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


def forward_activation_bytes(arch: ModelArch, tp: int, tokens: int, dtype_bytes: int) -> int:
    q_heads, kv_heads = heads_per_rank(arch, tp)
    qkv_out = (q_heads + 2 * kv_heads) * arch.head_dim
    inter = math.ceil(arch.intermediate_size / tp)
    return tokens * dtype_bytes * (4 * arch.hidden_size + qkv_out + 3 * inter)


def sampler_activation_bytes(arch: ModelArch, tokens: int, max_num_seqs: int) -> int:
    # Every TP rank gathers the full vocabulary's logits for one row per sequence.
    return min(max_num_seqs, tokens) * arch.vocab_size * LOGIT_BYTES


def activation_peak_bytes(
    arch: ModelArch, tp: int, batching: tuple[int, int], dtype_bytes: int, *, last_stage: bool, staging: int
) -> int:
    """Estimated torch activation peak on one GPU while vLLM profiles its largest batch."""
    tokens, max_num_seqs = batching
    total = forward_activation_bytes(arch, tp, tokens, dtype_bytes) + staging
    if last_stage:
        total += sampler_activation_bytes(arch, tokens, max_num_seqs)
    return total


def non_torch_bytes(world_size: int) -> int:
    """Estimated memory outside PyTorch's allocator (CUDA/cuBLAS workspaces, NCCL buffers)."""
    gib = NON_TORCH_GIB + (COLLECTIVES_GIB if world_size > 1 else 0.0)
    return int(gib * GIB)


def cuda_graph_bytes(
    arch: ModelArch, layers: int, max_num_seqs: int, dtype_bytes: int, enforce_eager: bool
) -> int:
    """Estimated CUDA-graph memory on one GPU (0 with enforce_eager)."""
    if enforce_eager or layers == 0:
        return 0
    capture = min(GRAPH_MAX_CAPTURE, 2 * max_num_seqs)
    return layers * capture * arch.hidden_size * dtype_bytes * GRAPH_BUFFERS_PER_LAYER
