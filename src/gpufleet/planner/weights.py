"""Weight bytes on one GPU of one pipeline stage, after ``cpu_offload_gb`` moved what it moves.

vLLM offloads per process (so per GPU) up to ``cpu_offload_gb`` GiB (2**30 bytes) of decoder-layer
parameters, layer by layer and parameter by parameter in load order, stopping after the parameter that
reaches the budget (``maybe_offload_to_cpu``); embeddings, ``lm_head``, norms outside the layers and
quantization state stay on the GPU. Calibrated on Qwen3-8B, TP=2, ``cpu_offload_gb`` 5: 2.6066 GiB
predicted, "Model loading took 2.6077 GiB".

On an NVIDIA GPU each tensor counts as the caching-allocator block it holds (:func:`cuda_block_bytes`),
because vLLM's figure is ``torch.cuda.memory_allocated()`` after loading minus before, and vLLM 0.24 loads
under ``max_split_size_mb:20`` (gpu_worker.py): a tensor of 20 MiB or more keeps its whole segment, the
tensor rounded up to 2 MiB. On an H100 (tests/gpu/weights_probe.py) that is 64 MiB for Gemma 3 1B, 144 MiB
for gpt-oss-20b and 82 of the 112 MiB for Qwen2.5-7B AWQ beyond the tensors themselves. Other platforms, or
a GPU the name does not place, count the tensors alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpufleet.planner.allocator import SharedSegments, cuda_block_bytes
from gpufleet.planner.arch import (
    GIB,
    ModelArch,
    Parallelism,
    Quantization,
    iter_layer_tensors,
    vocab_per_rank,
)
from gpufleet.planner.towers import tower_tensors


@dataclass(frozen=True)
class StageWeights:
    """Bytes of one GPU's share of the model, by part (as allocator blocks on an NVIDIA GPU)."""

    embedding_bytes: int
    layers_bytes: int  # decoder layers left on the GPU, quantization state included
    lm_head_bytes: int
    other_bytes: int  # final norm and the rotary cos/sin cache
    offloaded_bytes: int
    largest_offloaded_layer_bytes: int  # copied back to the GPU while that layer runs
    vision_bytes: int = 0  # a multimodal model's vision tower and projector (every stage builds them)

    @property
    def total_bytes(self) -> int:
        return (
            self.embedding_bytes
            + self.layers_bytes
            + self.lm_head_bytes
            + self.other_bytes
            + self.vision_bytes
        )


@dataclass(frozen=True)
class StageShape:
    """Where a GPU sits in the deployment and what it holds."""

    tp: int
    pp_rank: int
    pp_size: int
    layers: int
    dtype_bytes: int
    rotary_positions: int
    first_layer: int = 0
    expert_parallel: bool = False
    # vLLM's CUDA platform (an NVIDIA GPU): tensors count as caching-allocator blocks (cuda_block_bytes).
    cuda_allocator: bool = False
    # A multimodal model's tower is built unless --limit-mm-per-prompt sets every modality to 0.
    vision_tower: bool = True
    batched_tokens: int = 0  # max_num_batched_tokens (Qwen3-VL's deepstack buffers)
    mm_limits: Mapping[str, int] | None = None  # --limit-mm-per-prompt (Phi-4-multimodal's two towers)

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(self.tp, expert_parallel=self.expert_parallel)

    @property
    def layer_indices(self) -> range:
        return range(self.first_layer, self.first_layer + self.layers)


def stage_weights(
    arch: ModelArch, shape: StageShape, quant: Quantization | None, cpu_offload_gb: float
) -> StageWeights:
    """Weights on one GPU of the stage ``shape.pp_rank``."""
    is_first = shape.pp_rank == 0
    is_last = shape.pp_rank == shape.pp_size - 1
    block = cuda_block_bytes if shape.cuda_allocator else _tensor_bytes
    table_bytes = block(vocab_per_rank(arch, shape.tp) * arch.hidden_size * shape.dtype_bytes)
    # vLLM builds embed_tokens on the first stage, and on the last one too when lm_head is tied to it.
    has_embedding = is_first or (arch.tie_embeddings and is_last)
    has_lm_head = is_last and not arch.tie_embeddings
    other = block(arch.hidden_size * shape.dtype_bytes) if is_last else 0
    if shape.layers:
        rotary_bytes = arch.rotary_dtype_bytes or shape.dtype_bytes
        lengths = [shape.rotary_positions] * arch.rotary_caches
        if arch.rotary_caches == 2 and arch.local_rotary_positions:
            # Gemma 3: the local layers' cache is max_position_embeddings long (rope_local_base_freq, no
            # scaling)
            lengths[1] = arch.local_rotary_positions
        other += sum(block(length * arch.rotary_dim * rotary_bytes) for length in lengths)
    on_gpu, offloaded, largest = _offload_layers(arch, shape, quant, int(cpu_offload_gb * GIB), block)
    vision = 0
    if arch.vision is not None and shape.vision_tower:
        tensors = tower_tensors(
            arch.vision, shape.tp, shape.dtype_bytes, shape.batched_tokens, shape.mm_limits
        )
        vision = sum(block(size) for size in tensors)
    return StageWeights(
        vision_bytes=vision,
        embedding_bytes=table_bytes if has_embedding else 0,
        layers_bytes=on_gpu,
        lm_head_bytes=table_bytes if has_lm_head else 0,
        other_bytes=other,
        offloaded_bytes=offloaded,
        largest_offloaded_layer_bytes=largest,
    )


def _tensor_bytes(nbytes: int) -> int:
    return nbytes


def _offload_layers(
    arch: ModelArch,
    shape: StageShape,
    quant: Quantization | None,
    budget: int,
    block: Callable[[int], int] = _tensor_bytes,
) -> tuple[int, int, int]:
    """(bytes left on the GPU, bytes offloaded, most bytes offloaded from a single layer)."""
    on_gpu = offloaded = 0
    per_layer: dict[int, int] = {}
    if (
        block is cuda_block_bytes
    ):  # the layers' 1-10 MiB tensors share segments, in the order vLLM builds them
        block = SharedSegments().block
    for layer, tensor, state, tensors in iter_layer_tensors(
        arch, shape.parallelism, shape.layer_indices, shape.dtype_bytes, quant
    ):
        if offloaded < budget:
            # The parameter goes to the CPU; its quantization state (the tensors beyond it) stays.
            on_gpu += block(state) if state else 0
            offloaded += tensor
            per_layer[layer] = per_layer.get(layer, 0) + tensor
        else:
            on_gpu += sum(block(size) for size in tensors)
    return on_gpu, offloaded, max(per_layer.values(), default=0)
