"""The vision tower's tensors on one GPU, family by family, as vLLM 0.24's model files build them (see
:mod:`gpufleet.planner.multimodal` for which families and where they come from)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpufleet.planner import phi4mm
from gpufleet.planner.multimodal import VisionTower


def tower_tensors(
    tower: VisionTower,
    tp: int,
    dtype_bytes: int,
    batched_tokens: int = 0,
    limits: Mapping[str, int] | None = None,
) -> list[int]:
    """Bytes of each GPU tensor of the tower and projector on one tensor-parallel rank (model dtype);
    ``batched_tokens`` (``max_num_batched_tokens``) sizes Qwen3-VL's deepstack buffers; ``limits``
    (``--limit-mm-per-prompt``) skips Phi-4-multimodal's image or audio encoder on its own."""
    if tower.family == "phi4mm" and tower.audio is not None:
        numels = []
        if phi4mm.builds(limits, phi4mm.IMAGE_MODALITIES):
            numels += phi4mm.image_numels(tower.layers, tower.out_hidden_size, tp)
        if phi4mm.builds(limits, ("audio",)):
            numels += phi4mm.audio_numels(tower.audio, tower.out_hidden_size)
        return [numel * dtype_bytes for numel in numels]
    if tower.family == "qwen2_5_vl":
        return _qwen2_5_vl_tensors(tower, tp, dtype_bytes)
    if tower.family == "qwen3_vl":
        return _qwen3_vl_tensors(tower, tp, dtype_bytes, batched_tokens)
    if tower.family == "pixtral":
        return _pixtral_mistral3_tensors(tower, tp, dtype_bytes)
    if tower.family == "generic":
        return _generic_vit_tensors(tower, tp, dtype_bytes)
    return _siglip_gemma3_tensors(tower, tp, dtype_bytes)


def _pixtral_mistral3_tensors(tower: VisionTower, tp: int, element: int) -> list[int]:
    """pixtral.py's PixtralHFVisionModel and mistral3.py's projector: the bias-free Conv2d patch embedding,
    ``ln_pre`` (RMSNorm), ``num_hidden_layers`` blocks (two RMSNorms, bias-free ``qkv_proj``/``o_proj`` and a
    gated MLP), transformers' PixtralRotaryEmbedding buffer (``(image_size / patch)^2 x head_dim`` in float32,
    built on the GPU), then the projector: RMSNorm, the patch merger's ``hidden x merge^2 -> hidden`` (no
    bias), ``linear_1`` and ``linear_2`` to the text hidden size (biases with
    ``multimodal_projector_bias``)."""
    hidden, inter = tower.hidden_size, math.ceil(tower.intermediate_size / tp)
    head_dim = tower.head_dim or hidden // tower.num_heads
    heads = math.ceil(tower.num_heads / tp)
    text, text_rank = tower.out_hidden_size, math.ceil(tower.out_hidden_size / tp)
    layer = [
        hidden,  # attention_norm
        hidden,  # ffn_norm
        3 * heads * head_dim * hidden,
        hidden * heads * head_dim,
        2 * inter * hidden,
        hidden * inter,
    ]
    numels = [hidden * 3 * tower.patch_size**2, hidden, *(layer * tower.layers)]
    numels += [hidden, hidden * tower.spatial_merge_size**2 * hidden, text_rank * hidden, text * text_rank]
    if tower.projector_bias:
        numels += [text_rank, text]
    tensors = [numel * element for numel in numels]
    tensors.append((tower.image_size // tower.patch_size) ** 2 * head_dim * 4)  # rotary inv_freq, float32
    return tensors


def _qwen3_vl_tensors(tower: VisionTower, tp: int, element: int, batched_tokens: int) -> list[int]:
    """qwen3_vl.py's Qwen3_VisionTransformer: the Conv3d patch embedding *with* a bias, the learned position
    embedding (``num_position_embeddings x hidden``, not sharded), the rotary cache (8192 positions, half the
    head), ``depth`` blocks (two LayerNorms with biases, ``qkv``/``proj`` with biases, a plain MLP
    ``linear_fc1`` -> GELU -> ``linear_fc2`` with biases), the merger (LayerNorm over ``hidden``, two linears
    over ``hidden x merge^2``) and one deepstack merger per ``deepstack_visual_indexes`` entry (its LayerNorm
    over ``hidden x merge^2``, use_postshuffle_norm). Qwen3VLForConditionalGeneration then allocates one
    ``max_num_batched_tokens x text hidden`` buffer per deepstack level (``deepstack_input_embeds``, zeros
    in the model dtype) beside the tower: on the meta device, like the tower, when the limits skip it."""
    hidden, inter = tower.hidden_size, math.ceil(tower.intermediate_size / tp)
    head_dim = hidden // tower.num_heads
    heads = math.ceil(tower.num_heads / tp)
    qkv = 3 * heads * head_dim
    block = [
        *(hidden, hidden, hidden, hidden),  # norm1, norm2: weight and bias each
        qkv * hidden,
        qkv,
        hidden * heads * head_dim,
        hidden,
        inter * hidden,  # linear_fc1
        inter,
        hidden * inter,  # linear_fc2
        hidden,
    ]
    merged = hidden * tower.spatial_merge_size**2
    merged_rank = math.ceil(merged / tp)
    linears = [merged_rank * merged, merged_rank, tower.out_hidden_size * merged_rank, tower.out_hidden_size]
    numels = [
        hidden * 3 * tower.temporal_patch_size * tower.patch_size**2,
        hidden,  # the patch embedding's bias
        tower.position_embeddings * hidden,
        8192 * (head_dim // 2),  # get_rope(head_dim, max_position=8192, partial_rotary_factor=0.5)
    ]
    numels += block * tower.layers
    numels += [hidden, hidden, *linears]  # merger
    numels += [merged, merged, *linears] * tower.deepstack_levels
    numels += [batched_tokens * tower.out_hidden_size] * tower.deepstack_levels
    return [numel * element for numel in numels]


def _qwen2_5_vl_tensors(tower: VisionTower, tp: int, element: int) -> list[int]:
    hidden, inter = tower.hidden_size, math.ceil(tower.intermediate_size / tp)
    head_dim = hidden // tower.num_heads
    heads = math.ceil(tower.num_heads / tp)
    qkv = 3 * heads * head_dim
    patch = hidden * 3 * tower.temporal_patch_size * tower.patch_size**2
    rotary = 8192 * (head_dim // 2)  # get_rope(head_dim, max_position=8192, partial_rotary_factor=0.5)
    block = [
        hidden,  # norm1
        hidden,  # norm2
        qkv * hidden,
        qkv,
        hidden * heads * head_dim,  # proj (row parallel)
        hidden,  # proj bias
        2 * inter * hidden,  # gate_up_proj
        2 * inter,
        hidden * inter,  # down_proj
        hidden,
    ]
    merged = hidden * tower.spatial_merge_size**2
    merged_rank = math.ceil(merged / tp)
    merger = [
        hidden,
        merged_rank * merged,
        merged_rank,
        tower.out_hidden_size * merged_rank,
        tower.out_hidden_size,
    ]
    numels = [patch, rotary] + block * tower.layers + merger
    return [numel * element for numel in numels]


def _siglip_gemma3_tensors(tower: VisionTower, tp: int, element: int) -> list[int]:
    hidden, inter = tower.hidden_size, math.ceil(tower.intermediate_size / tp)
    head_dim = hidden // tower.num_heads
    heads = math.ceil(tower.num_heads / tp)
    positions = (tower.image_size // tower.patch_size) ** 2
    layer = [
        hidden,  # layer_norm1 weight
        hidden,  # layer_norm1 bias
        3 * heads * head_dim * hidden,  # qkv_proj
        3 * heads * head_dim,
        hidden * heads * head_dim,  # out_proj
        hidden,
        hidden,  # layer_norm2 weight
        hidden,  # layer_norm2 bias
        inter * hidden,  # fc1
        inter,
        hidden * inter,  # fc2
        hidden,
    ]
    numels = [
        hidden * 3 * tower.patch_size**2,
        hidden,
        positions * hidden,
    ]  # patch embedding, its bias, positions
    numels += layer * tower.layers
    numels += [hidden, hidden]  # post_layernorm
    numels += [hidden * tower.out_hidden_size, hidden]  # projector and its soft-embedding norm
    tensors = [numel * element for numel in numels]
    tensors.append(positions * 8)  # position_ids: an int64 buffer
    return tensors


def _generic_vit_tensors(tower: VisionTower, tp: int, element: int) -> list[int]:
    """An estimate for a family not read from vLLM's code (multimodal.generic_vision)."""
    hidden, inter = tower.hidden_size, math.ceil(tower.intermediate_size / tp)
    heads_dim = math.ceil(tower.num_heads / tp) * (hidden // tower.num_heads)
    text, text_rank = tower.out_hidden_size, math.ceil(tower.out_hidden_size / tp)
    layer = [4 * hidden, 3 * heads_dim * hidden + 3 * heads_dim, hidden * heads_dim + hidden]
    layer += [inter * hidden + inter, hidden * inter + hidden]
    numels = [
        hidden * 3 * tower.patch_size**2 + hidden,
        ((tower.image_size // tower.patch_size) ** 2 + 1) * hidden,
    ]
    numels += layer * tower.layers
    numels += [2 * hidden, text_rank * hidden + text_rank, text * text_rank + text]
    return [numel * element for numel in numels]
