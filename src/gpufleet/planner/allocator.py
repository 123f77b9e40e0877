"""PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) as vLLM 0.24's weight loading
drives it.

"Model loading took" is ``torch.cuda.memory_allocated()`` after minus before (DeviceMemoryProfiler,
vllm/utils/mem_utils.py:86, and platforms/cuda.py:350), which counts the allocator's blocks, not the tensors
in them. vLLM loads under ``max_split_size_mb:20`` (vllm/v1/worker/gpu_worker.py:382, Worker.load_model).
"""

from __future__ import annotations

MIB = 2**20
ALLOC_ROUND = 512  # kMinBlockSize: every request is rounded up to 512 bytes
SMALL_REQUEST = MIB  # kSmallSize: the small pool's largest request; a split must leave more than this
LARGE_SEGMENT_FROM = 10 * MIB  # kMinLargeAlloc: from here a request gets its own segment ...
SEGMENT_ROUND = 2 * MIB  # kRoundLarge: ... rounded up to 2 MiB
SHARED_SEGMENT = 20 * MIB  # kLargeBuffer: the segment a request of 1-10 MiB is cut from
# vLLM 0.24 loads the weights with max_split_size_mb:20, so a block of 20 MiB or more is never split.
LOAD_MAX_SPLIT = 20 * MIB


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def cuda_block_bytes(nbytes: int) -> int:
    """The block a tensor of ``nbytes`` holds, taken on its own.

    A request is rounded up to 512 bytes; one of 10 MiB or more gets a new segment rounded up to 2 MiB, and
    the block keeps the whole segment when the request is at least ``max_split_size`` (20 MiB while loading)
    or when no more than 1 MiB would be left over. Smaller requests are cut from shared segments: see
    :class:`SharedSegments` for what the order of the requests adds. Measured on an H100
    (tests/gpu/weights_probe.py): 6,053 of the 6,102 tensor blocks of the 11 v0.24 cases are what this rule
    says; the others are 30.5 MiB for Qwen2.5-7B AWQ, 0.6 MiB for Gemma 3 1B, 0.2 MiB for gpt-oss-20b and
    16 MiB for Llama 3.1 8B (a 48 MiB tensor placed in a 64 MiB block a freed temporary left).
    """
    size = max(ALLOC_ROUND, _round_up(nbytes, ALLOC_ROUND))
    if size < LARGE_SEGMENT_FROM:
        return size
    segment = _round_up(size, SEGMENT_ROUND)
    if size >= LOAD_MAX_SPLIT or segment - size <= SMALL_REQUEST:
        return segment
    return size


class SharedSegments:
    """The large pool's shared 20 MiB segments, fed the requests in the order vLLM builds the layers.

    A request of more than 1 MiB and less than 10 MiB takes the smallest free block that holds it (best fit),
    or a new 20 MiB segment; the block is split only when more than 1 MiB would be left (``kSmallSize``), so
    a request that leaves 1 MiB or less keeps the whole block, and ``memory_allocated`` counts it. Falcon-H1
    0.5B's layers (1.5, 6.5, 3, 8 and 4 MiB tensors) lose about 0.7 MiB of a segment per layer this way.
    Other requests follow :func:`cuda_block_bytes`.
    """

    def __init__(self) -> None:
        self._free: list[int] = []

    def block(self, nbytes: int) -> int:
        size = max(ALLOC_ROUND, _round_up(nbytes, ALLOC_ROUND))
        if size <= SMALL_REQUEST or size >= LARGE_SEGMENT_FROM:
            return cuda_block_bytes(nbytes)
        fits = [free for free in self._free if free >= size]
        if fits:
            found = min(fits)
            self._free.remove(found)
        else:
            found = SHARED_SEGMENT
        if found - size > SMALL_REQUEST:
            self._free.append(found - size)
            return size
        return found
