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
- hybrid state-space models (Nemotron-H, Granite 4.0 H, Falcon-H1, Jamba, Qwen3-Next; planner/hybrid.py): each
  Mamba (or gated DeltaNet) layer keeps one fixed state per
  sequence (``MambaSpec``, ``mamba_cache_mode`` "none": prefix caching is off for hybrid models by default,
  ``ModelConfig.is_prefix_caching_supported``), the conv state plus the SSM state. vLLM raises the attention
  block size until an attention page holds a Mamba state (``Platform._align_hybrid_block_size``: ``block_size
  = align x cdiv(mamba_page, align x attention_page_per_token)``, ``align = max(16, block_size)`` for
  FlashAttention) and pads the Mamba page to the attention page; the Mamba layers and the attention layers
  then form groups like any two attention types, and a request holds one block in each Mamba group
  (``MambaSpec.max_memory_usage_bytes``).
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
    mamba_groups: int = 0  # groups of Mamba layers: one block (a sequence's state) per request each
    mamba_state_bytes: int = 0  # one layer's state per sequence before vLLM pads it to page_bytes

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
        total = self.mamba_groups
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


# FlashAttention's smallest kernel block (get_supported_kernel_block_sizes: MultipleOf(16), or 16/32/64 for a
# hybrid model with a float32 Mamba state): the alignment of a hybrid model's attention block.
FLASH_ATTENTION_BLOCK_ALIGN = 16


def hybrid_block_size(per_token: int, mamba_state: int, block_size: int) -> int:
    """The attention block size vLLM 0.24 settles on for a hybrid model (``_align_hybrid_block_size``,
    without prefix caching): the smallest multiple of the kernel alignment whose page holds a Mamba state."""
    align = max(FLASH_ATTENTION_BLOCK_ALIGN, block_size)
    needed = align * math.ceil(mamba_state / (align * per_token))
    return max(block_size, needed)


def kv_layout(
    arch: ModelArch,
    layers: range,
    tp: int,
    kv_dtype_bytes: int,
    block_size: int,
    *,
    dtype_bytes: int = 2,
) -> KvLayout:
    """The layout vLLM builds for the attention (and Mamba) layers ``layers`` on one GPU; ``dtype_bytes``
    is the model dtype's (a Mamba conv state's)."""
    per_token = kv_bytes_per_token_layer(arch, tp, kv_dtype_bytes)
    if arch.mamba is not None:
        return _hybrid_layout(arch, layers, tp, per_token, block_size=block_size, dtype_bytes=dtype_bytes)
    page = block_size * per_token
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


def _hybrid_layout(
    arch: ModelArch, layers: range, tp: int, per_token: int, *, block_size: int, dtype_bytes: int
) -> KvLayout:
    """Attention and Mamba layers: one page size for both (the Mamba state padded), groups as for two
    attention types (``_get_kv_cache_groups_uniform_page_size``); MLP-only blocks hold no cache."""
    assert arch.mamba is not None
    state = arch.mamba.state_bytes(tp, dtype_bytes)
    size = hybrid_block_size(per_token, state, block_size)
    attention = sum(1 for layer in layers if arch.is_attention_layer(layer))
    mamba = sum(1 for layer in layers if arch.is_state_layer(layer))
    counts = [count for count in (attention, mamba) if count]
    if not counts:
        return KvLayout(size * per_token, 0, (), size)
    smallest, largest = min(counts), max(counts)
    group_size = largest if largest < smallest * 1.5 else smallest
    windows: tuple[None, ...] = (None,) * math.ceil(attention / group_size) if attention else ()
    return KvLayout(
        size * per_token,
        group_size,
        windows,
        size,
        mamba_groups=math.ceil(mamba / group_size) if mamba else 0,
        mamba_state_bytes=state,
    )
