"""Multimodal models: the vision tower's weights and whether vLLM 0.24 builds the tower at all.

Mirrors what vLLM 0.24 builds for the families the planner models:

- **Qwen2.5-VL** (``Qwen2_5_VLForConditionalGeneration``, vllm/model_executor/models/qwen2_5_vl.py): the patch
  embedding (a bias-free ``Conv3dLayer``, ``hidden x 3 x temporal_patch x patch x patch``), a rotary cache
  (``get_rope(head_dim, max_position=8192, partial_rotary_factor=0.5)``), ``depth`` blocks of two RMSNorms,
  ``qkv`` and ``proj`` with biases and a gated MLP (``gate_up_proj``, ``down_proj``, biases), and the patch
  merger (RMSNorm, ``4 hidden x 4 hidden`` and ``out_hidden x 4 hidden`` with biases). The language model is
  Qwen2's (q/k/v biases).
- **Qwen3-VL** (``Qwen3VLForConditionalGeneration``, ``Qwen3VLMoeForConditionalGeneration``, qwen3_vl.py):
  see :mod:`gpufleet.planner.towers`; the language model is Qwen3's (q/k norms), dense or MoE.
- **Mistral Small 3.x** (``Mistral3ForConditionalGeneration``, mistral3.py with pixtral.py's HF-format tower):
  see :func:`gpufleet.planner.towers._pixtral_mistral3_tensors`; the language model is Mistral's.
- **Gemma 3** (``Gemma3ForConditionalGeneration``, gemma3_mm.py and siglip.py): SigLIP's patch embedding
  (``Conv2dLayer`` with a bias), position embedding (``(image_size / patch)^2 x hidden`` and an int64
  ``position_ids`` buffer), ``num_hidden_layers`` encoder layers (two LayerNorms with biases, ``qkv_proj``,
  ``out_proj``, ``fc1``, ``fc2``, all with biases), the post LayerNorm, and the projector
  (``mm_input_projection_weight``: vision hidden x text hidden, and an RMSNorm).
- **Phi-4-multimodal** (``Phi4MMForCausalLM``, phi4mm.py): an image and an audio encoder outside
  ``vision_config``, each skipped on its own; see :mod:`gpufleet.planner.phi4mm`.

The tower is sharded over tensor-parallel ranks like the language model (vLLM's default
``mm_encoder_tp_mode`` "weights"), and is not split by pipeline stage: every rank builds it.

``--limit-mm-per-prompt`` with every modality at 0 makes vLLM build the language model alone
(``SupportsMultiModal._mark_tower_model``: the tower's modules become ``StageMissingLayer``; no weights, no
encoder profiling). Other multimodal families are refused as unmodelled (the planner names them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.planner import phi4mm

# architectures[0] -> (family, the modalities whose limits decide whether vLLM builds the tower)
MODELLED = {
    "Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", ("image", "video")),
    "Qwen3VLForConditionalGeneration": ("qwen3_vl", ("image", "video")),
    "Qwen3VLMoeForConditionalGeneration": ("qwen3_vl", ("image", "video")),
    "Gemma3ForConditionalGeneration": ("gemma3", ("image",)),
    "Mistral3ForConditionalGeneration": ("pixtral", ("image",)),
    phi4mm.ARCHITECTURE: ("phi4mm", (*phi4mm.IMAGE_MODALITIES, "audio")),
}


@dataclass(frozen=True)
class VisionTower:
    """The vision encoder and projector of a multimodal model, as vLLM 0.24 builds them."""

    family: str  # "qwen2_5_vl" | "qwen3_vl" | "gemma3" | "pixtral"
    hidden_size: int
    intermediate_size: int
    layers: int
    num_heads: int
    patch_size: int
    out_hidden_size: int  # the language model's hidden size
    modalities: tuple[str, ...]
    temporal_patch_size: int = 1
    spatial_merge_size: int = 1
    image_size: int = 0  # SigLIP's fixed input size
    tokens_per_image: int = 0  # Gemma 3's mm_tokens_per_image
    position_embeddings: int = 0  # Qwen3-VL's learned pos_embed rows (num_position_embeddings)
    deepstack_levels: int = 0  # Qwen3-VL's deepstack_visual_indexes: one more merger and buffer each
    head_dim: int = 0  # Pixtral's vision head_dim (0: hidden / heads)
    projector_bias: bool = False  # Mistral 3's multimodal_projector_bias
    architecture: str = ""  # the multimodal class (architectures[0]), for the generic estimate's warning
    audio: phi4mm.ConformerAudio | None = None  # Phi-4-multimodal's audio encoder

    def builds_tower(self, limits: Mapping[str, int] | None) -> bool:
        """False when every modality of the tower is limited to 0 items per prompt (vLLM then loads the
        language model alone); an unnamed modality keeps vLLM's default of 999."""
        if not limits:
            return True
        return any(limits.get(modality, 999) > 0 for modality in self.modalities)


def generic_vision(config: Mapping[str, Any], name: str) -> VisionTower | None:
    """A family whose tower the planner has not read from vLLM's code (Llama 4, InternVL, ...), estimated as
    a plain ViT from its vision_config: patch and position embeddings, ``layers`` pre-norm blocks (two
    LayerNorms, q/k/v and output projections, a two-layer MLP, all with biases) and a two-layer projector to
    the language model. The plan says so, with a margin (checks.py). None without the ViT's sizes."""
    vision: Mapping[str, Any] = config["vision_config"]
    text = config.get("text_config") or config.get("llm_config") or config
    # Qwen2VLVisionConfig names the tower's width embed_dim and its MLP's mlp_ratio; its hidden_size is the
    # patch merger's output (the language model's width), so embed_dim wins where both are given.
    hidden = _positive(vision, "embed_dim") or _positive(vision, "hidden_size") or _positive(vision, "width")
    layers = _positive(vision, "num_hidden_layers") or _positive(vision, "depth")
    if not hidden or not layers or not isinstance(text, Mapping):
        return None
    ratio = vision.get("mlp_ratio")
    mlp = (
        int(hidden * ratio)
        if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0
        else 0
    )
    return VisionTower(
        family=GENERIC,
        hidden_size=hidden,
        intermediate_size=_positive(vision, "intermediate_size", mlp or 4 * hidden),
        layers=layers,
        num_heads=_positive(vision, "num_attention_heads") or _positive(vision, "num_heads", 16),
        patch_size=_positive(vision, "patch_size", 14),
        out_hidden_size=_positive(text, "hidden_size", hidden),
        modalities=GENERIC_MODALITIES.get(name, ("image",)),
        image_size=_positive(vision, "image_size", 448),
        architecture=name,
    )


def _positive(config: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = config.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


# Families whose tower is estimated as a generic ViT (GENERIC): the modalities their vLLM model marks as the
# tower's (``_mark_tower_model``); any other unmodelled family is taken as image-only.
GENERIC_MODALITIES = {
    "InternVLForConditionalGeneration": ("image", "video"),
    "InternVLChatModel": ("image", "video"),
    "Llama4ForConditionalGeneration": ("image",),
}
GENERIC = "generic"


def parse_vision(config: Mapping[str, Any]) -> VisionTower | None:
    """The vision tower of a multimodal architecture; None for a text-only model, or for an unmodelled family
    whose vision_config lacks the ViT's sizes (hidden size and layers). An unmodelled family with them gets
    the ``generic`` estimate (:func:`generic_vision`)."""
    architectures = config.get("architectures")
    name = str(architectures[0]) if isinstance(architectures, list) and architectures else ""
    if name == phi4mm.ARCHITECTURE or not isinstance(config.get("vision_config"), dict):
        return _phi4mm_tower(config) if name == phi4mm.ARCHITECTURE else None
    if name not in MODELLED:
        return generic_vision(config, name)
    family, modalities = MODELLED[name]
    vision: Mapping[str, Any] = config["vision_config"]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(text, Mapping)
    if family == "qwen3_vl":
        indexes = vision.get("deepstack_visual_indexes")
        return VisionTower(
            family=family,
            hidden_size=_positive(vision, "hidden_size", 1152),
            intermediate_size=_positive(vision, "intermediate_size", 4304),
            layers=_positive(vision, "depth", 27),
            num_heads=_positive(vision, "num_heads", 16),
            patch_size=_positive(vision, "patch_size", 16),
            out_hidden_size=_positive(vision, "out_hidden_size", _positive(text, "hidden_size")),
            modalities=modalities,
            temporal_patch_size=_positive(vision, "temporal_patch_size", 2),
            spatial_merge_size=_positive(vision, "spatial_merge_size", 2),
            position_embeddings=_positive(vision, "num_position_embeddings", 2304),
            deepstack_levels=len(indexes) if isinstance(indexes, list) else 0,
        )
    if family == "pixtral":
        return VisionTower(
            family=family,
            hidden_size=_positive(vision, "hidden_size", 1024),
            intermediate_size=_positive(vision, "intermediate_size", 4096),
            layers=_positive(vision, "num_hidden_layers", 24),
            num_heads=_positive(vision, "num_attention_heads", 16),
            patch_size=_positive(vision, "patch_size", 14),
            out_hidden_size=_positive(text, "hidden_size"),
            modalities=modalities,
            spatial_merge_size=_positive(config, "spatial_merge_size", 2),
            image_size=_positive(vision, "image_size", 1540),
            head_dim=_positive(vision, "head_dim"),
            projector_bias=bool(config.get("multimodal_projector_bias", False)),
        )
    if family == "qwen2_5_vl":
        return VisionTower(
            family=family,
            hidden_size=_positive(vision, "hidden_size", 1280),
            intermediate_size=_positive(vision, "intermediate_size", 3420),
            layers=_positive(vision, "depth", 32),
            num_heads=_positive(vision, "num_heads", 16),
            patch_size=_positive(vision, "patch_size", 14),
            out_hidden_size=_positive(vision, "out_hidden_size", _positive(text, "hidden_size")),
            modalities=modalities,
            temporal_patch_size=_positive(vision, "temporal_patch_size", 2),
            spatial_merge_size=_positive(vision, "spatial_merge_size", 2),
        )
    return VisionTower(
        family=family,
        hidden_size=_positive(vision, "hidden_size", 1152),
        intermediate_size=_positive(vision, "intermediate_size", 4304),
        layers=_positive(vision, "num_hidden_layers", 27),
        num_heads=_positive(vision, "num_attention_heads", 16),
        patch_size=_positive(vision, "patch_size", 14),
        out_hidden_size=_positive(text, "hidden_size"),
        modalities=modalities,
        image_size=_positive(vision, "image_size", 896),
        tokens_per_image=_positive(config, "mm_tokens_per_image", 256),
    )


def _phi4mm_tower(config: Mapping[str, Any]) -> VisionTower:
    siglip = phi4mm.SIGLIP
    return VisionTower(
        family="phi4mm",
        hidden_size=siglip["hidden"],
        intermediate_size=siglip["intermediate"],
        layers=phi4mm.image_layers(config),
        num_heads=siglip["heads"],
        patch_size=siglip["patch"],
        out_hidden_size=_positive(config, "hidden_size"),
        modalities=MODELLED[phi4mm.ARCHITECTURE][1],
        image_size=siglip["image"],
        architecture=phi4mm.ARCHITECTURE,
        audio=phi4mm.parse_audio(config),
    )


# Qwen2-VL's image processor default (min_pixels 3136, max_pixels 12845056); --mm-processor-kwargs is not
# modelled. vllm/model_executor/models/qwen2_vl.py: _MAX_FRAMES_PER_VIDEO.
QWEN_MAX_PIXELS = 12_845_056
QWEN_MAX_FRAMES_PER_VIDEO = 14
DEFAULT_MM_LIMIT = 999  # MultiModalConfig.get_limit_per_prompt for a modality left out
# Qwen3-VL's processors (transformers' Qwen2VLImageProcessor and Qwen3VLVideoProcessor sizes as Qwen3-VL ships
# them: longest_edge 16777216 and 25165824 pixels).
QWEN3_VL_IMAGE_MAX_PIXELS = 16_777_216
QWEN3_VL_VIDEO_MAX_PIXELS = 25_165_824


@dataclass(frozen=True)
class EncoderProfile:
    """What vLLM 0.24's profile run does with the tower (``GPUModelRunner.profile_run``,
    ``MultiModalBudget``): ``items`` dummy items of ``modality``, each ``tokens_per_item`` tokens."""

    modality: str
    tokens_per_item: int
    budget: int  # encoder cache budget, tokens
    items: int
    forward_peak_bytes: int  # the encoder's dummy forward (estimate, see encoder_profile)
    outputs_bytes: int  # encoder outputs kept in the encoder cache while the language model's dummy run runs


def _qwen3_vl_max_tokens(tower: VisionTower, modality: str) -> int:
    """Qwen3VLProcessingInfo: an image at the image processor's ``longest_edge`` pixels; a video of two frames
    at the video processor's ``longest_edge`` over the temporal patch (``get_max_video_tokens``)."""
    unit = tower.patch_size * tower.spatial_merge_size
    if modality == "image":
        return QWEN3_VL_IMAGE_MAX_PIXELS // (unit * unit)
    return QWEN3_VL_VIDEO_MAX_PIXELS // tower.temporal_patch_size // (unit * unit)


def _qwen_max_tokens(tower: VisionTower, modality: str, max_model_len: int) -> int:
    """Qwen2VLProcessingInfo.get_max_image_tokens / get_max_video_tokens for one item."""
    unit = tower.patch_size * tower.spatial_merge_size
    image = QWEN_MAX_PIXELS // (unit * unit)
    if modality == "image":
        return image

    def video(frames: int) -> int:  # get_num_video_tokens: frames padded to the temporal patch
        padded = frames + frames % tower.temporal_patch_size
        return max(padded // tower.temporal_patch_size, 1) * image

    frames = 1
    while video(frames + 1) <= max_model_len:  # _get_max_video_frames
        frames += 1
    return video(min(frames, QWEN_MAX_FRAMES_PER_VIDEO))


def encoder_profile(
    tower: VisionTower,
    limits: Mapping[str, int] | None,
    *,
    max_model_len: int,
    batching: tuple[int, int],
    tp: int,
    dtype_bytes: int,
) -> EncoderProfile | None:
    """The encoder part of vLLM 0.24's profile run; None when every modality is limited to 0.

    Which items: the modality with the most tokens per item (``get_modality_with_max_tokens``), the budget
    ``max(max_num_batched_tokens, its tokens)`` (``compute_mm_encoder_budget``), and as many items as fit it
    (``MultiModalBudget._get_max_items``, chunked prefill on). The forward peak is an estimate read from the
    towers' block code, not a measured constant: the dummy pixels (float32 from the processor, and their copy
    in the model dtype) plus, per patch, the residual stream, the residual and the normed input (3 x hidden)
    and the MLP's intermediate and activation output (3 x intermediate for Qwen2.5-VL's gated MLP, 2 x for
    SigLIP's fc1 -> GELU), all in the model dtype."""
    limits = limits or {}
    # Phi-4-multimodal builds its image encoder for an unset video limit but profiles image and audio only.
    profiled = ("image", "audio") if tower.family == "phi4mm" else tower.modalities
    active = [m for m in profiled if limits.get(m, DEFAULT_MM_LIMIT) > 0]
    if not active:
        return None
    tokens_per_item: dict[str, int] = {}
    for modality in active:
        if tower.family == "qwen2_5_vl":
            tokens_per_item[modality] = _qwen_max_tokens(tower, modality, max_model_len)
        elif tower.family == "qwen3_vl":
            tokens_per_item[modality] = _qwen3_vl_max_tokens(tower, modality)
        elif tower.family == "phi4mm" and tower.audio is not None:
            tokens_per_item[modality] = (
                phi4mm.max_image_tokens()[0] if modality == "image" else phi4mm.max_audio_tokens(tower.audio)
            )
        elif tower.family == GENERIC:  # every patch of a full-size image, before any merging
            tokens_per_item[modality] = (tower.image_size // tower.patch_size) ** 2
        elif tower.family == "pixtral":  # PixtralHFEncoderInfo: a full-size image, merged patches
            tokens_per_item[modality] = (
                math.ceil(tower.image_size / (tower.patch_size * tower.spatial_merge_size)) ** 2
            )
        else:
            tokens_per_item[modality] = tower.tokens_per_image
    modality, tokens = max(tokens_per_item.items(), key=lambda item: (item[1], item[0]))
    batched_tokens, max_num_seqs = batching
    budget = max(batched_tokens, tokens)
    per_prompt = max(1, min(limits.get(modality, DEFAULT_MM_LIMIT), max_model_len // tokens))
    items = max(1, min(budget // tokens, max_num_seqs * per_prompt))
    inter = math.ceil(tower.intermediate_size / tp)
    if tower.family == "phi4mm" and tower.audio is not None:
        peak = _phi4mm_peak(
            tower, tower.audio, modality=modality, items=items, inter=inter, element=dtype_bytes
        )
        outputs = items * tokens * tower.out_hidden_size * dtype_bytes
        return EncoderProfile(modality, tokens, budget, items, peak, outputs)
    if tower.family in {"qwen2_5_vl", "qwen3_vl"}:
        patches = items * tokens * tower.spatial_merge_size**2
        pixels = patches * 3 * tower.temporal_patch_size * tower.patch_size**2
        # Qwen2.5-VL: gate_up output (2 x) and the SiLU-and-mul output; Qwen3-VL: fc1's output and the GELU's
        mlp = 3 * inter if tower.family == "qwen2_5_vl" else 2 * inter
    else:
        patches = items * (tower.image_size // tower.patch_size) ** 2
        pixels = items * 3 * tower.image_size**2
        # SigLIP: fc1's output and the GELU's; Pixtral: gate_up's output and the SiLU-and-mul's
        mlp = 3 * inter if tower.family == "pixtral" else 2 * inter
    peak = pixels * (4 + dtype_bytes) + patches * (3 * tower.hidden_size + mlp) * dtype_bytes
    # Qwen3-VL's encoder output carries each deepstack level beside the merger's (out_hidden x (1 + levels)).
    outputs = items * tokens * tower.out_hidden_size * (1 + tower.deepstack_levels) * dtype_bytes
    return EncoderProfile(modality, tokens, budget, items, peak, outputs)


def _phi4mm_peak(
    tower: VisionTower, audio: phi4mm.ConformerAudio, *, modality: str, items: int, inter: int, element: int
) -> int:
    """Phi-4-multimodal's encoder forward (estimate, as for SigLIP): an image is ``dynamic_hd + 1`` crops of
    448 x 448 (float32 pixels and their model-dtype copy), 1024 patches each through the residual stream and
    fc1 -> GELU; an audio item is its float32 mel frames and, per frame, the Conformer's residual stream and
    its GLU feed-forward (2 x linear_units, and linear_units after the GLU)."""
    if modality == "image":
        crops = items * phi4mm.max_image_tokens()[1]
        patches = crops * (tower.image_size // tower.patch_size) ** 2
        pixels = crops * 3 * tower.image_size**2
        return pixels * (4 + element) + patches * (3 * tower.hidden_size + 2 * inter) * element
    frames = items * phi4mm.AUDIO_MAX_FRAMES
    return frames * audio.input_size * (4 + element) + frames * (3 * audio.dim + 3 * audio.ffn) * element
