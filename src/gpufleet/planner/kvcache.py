"""vLLM 0.24's KV-cache layout: groups of layers, blocks, and the token count it prints.

Mirrors ``vllm/v1/core/kv_cache_utils.py`` and ``vllm/v1/kv_cache_interface.py``:

- every attention layer has a page of ``block_size`` tokens (``2 x KV heads x head_dim x bytes`` per
  token; ``(kv_lora_rank + qk_rope_head_dim) x bytes`` for MLA);
- one attention type (all full, or all the same window): one group of every layer; ``num_blocks =
  memory // page // layers``;
- full and sliding-window layers (Gemma 2/3, gpt-oss; the hybrid allocator is on by default on CUDA): the
  layers of each type are cut into groups of ``group_size`` layers (the smallest type's count, or the
  largest's when that is less than 1.5 times the smallest), padding the last; ``num_blocks = memory //
  page // group_size``;
- the token count vLLM prints is ``int(max_concurrency x max_model_len)`` where ``max_concurrency =
  num_blocks / blocks_per_request`` and a request takes ``cdiv(max_model_len, block_size)`` blocks in a
  full-attention group and ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1``
  in a sliding-window group. With full attention only this is ``num_blocks x block_size`` whenever
  ``max_model_len`` is a multiple of the block size.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from gpufleet.planner.arch import ModelArch, kv_bytes_per_token_layer


@dataclass(frozen=True)
class KvLayout:
    """The KV-cache groups on one GPU: ``windows`` holds one entry per group (None = full attention)."""

    page_bytes: int  # one layer's page of block_size tokens
    group_size: int  # layers per group = KV tensors sharing each block
    windows: tuple[int | None, ...]
    block_size: int

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * self.group_size

    @property
    def bytes_per_token(self) -> int:
        """Memory one block slot costs per token (what divides the KV memory into blocks)."""
        return self.block_bytes // self.block_size if self.block_size else 0

    def blocks(self, kv_cache_bytes: int) -> int:
        if self.block_bytes <= 0:
            return 0
        return max(0, kv_cache_bytes // self.page_bytes // self.group_size)

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        total = 0
        for window in self.windows:
            if window is None:
                total += math.ceil(max_model_len / self.block_size)
            else:
                held = min(window - 1 + max_num_batched_tokens, max_model_len)
                total += math.ceil(held / self.block_size) + 1
        return total

    def capacity(self, blocks: int, max_model_len: int, max_num_batched_tokens: int) -> tuple[int, float]:
        """(tokens, maximum concurrency) as vLLM prints them for ``blocks`` blocks."""
        per_request = self.blocks_per_request(max_model_len, max_num_batched_tokens)
        if not per_request:
            return 0, 0.0
        concurrency = blocks / per_request
        return int(concurrency * max_model_len), concurrency


def kv_layout(arch: ModelArch, layers: range, tp: int, kv_dtype_bytes: int, block_size: int) -> KvLayout:
    """The layout vLLM builds for the attention layers ``layers`` on one GPU."""
    page = block_size * kv_bytes_per_token_layer(arch, tp, kv_dtype_bytes)
    counts = Counter(arch.window(layer) for layer in layers)
    if len(counts) <= 1:
        window = next(iter(counts), None)
        return KvLayout(page, len(layers), (window,) if layers else (), block_size)
    smallest, largest = min(counts.values()), max(counts.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    windows: list[int | None] = []
    for window, count in counts.items():
        windows += [window] * math.ceil(count / group_size)
    return KvLayout(page, group_size, tuple(windows), block_size)
