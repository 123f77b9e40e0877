"""Phi-4-multimodal (``Phi4MMForCausalLM``): its image and audio encoders as vLLM 0.24 builds them.

Read from vLLM 0.24.0's wheel (vllm/model_executor/models/phi4mm.py, phi4mm_audio.py, phi4mm_utils.py and
idefics2_vision_model.py). The towers live outside ``vision_config``:

- **Image** (``Phi4MMImageEncoder``, inside ``_mark_tower_model(vllm_config, {"image", "video"})``):
  ``get_navit_vision_model`` builds an ``Idefics2VisionTransformer`` from a fixed SigLIP-so400m config
  (hidden 1152, MLP 4304, 16 heads, patch 14, image 448, 27 layers) cut to ``27 + layer_idx + 1`` layers
  (``img_processor.layer_idx``, -2 by default: 26), without the post LayerNorm: the Conv2d patch embedding
  with a bias, the position embedding (``(448 / 14)^2 x 1152``), and per layer two LayerNorms, ``qkv_proj``,
  ``out_proj``, ``fc1`` and ``fc2`` with biases (tensor-parallel). Then ``glb_GN`` and ``sub_GN`` (1152 each)
  and ``img_projection``: plain ``nn.Linear`` 1152 -> hidden and hidden -> hidden with biases (not sharded).
- **Audio** (``AudioEmbedding``, inside ``_mark_tower_model(vllm_config, "audio")``): the
  ``ConformerEncoder`` of ``audio_processor.config`` (plain ``nn`` modules, not sharded): the
  ``NemoConvSubsampling`` "dw_striding" front end (a 1 -> channels 3x3 conv, then per further factor of 2 a
  depthwise 3x3 and a pointwise conv, all with biases, and ``out``: channels x input_size / time_reduction ->
  attention_dim), T5 relative attention biases (``2 x t5_bias_max_distance x heads``), the
  ``MeanVarianceNormLayer`` (two ``input_size`` parameters) and ``num_blocks`` Conformer blocks (two GLU
  feed-forwards, four attention linears, the convolution module, two LayerNorms); then two projection MLPs,
  ``audio_projection`` and ``audio_projection_for_vision`` (attention_dim -> hidden -> hidden, biases).

Counted on the meta device from vLLM 0.24's own audio classes for the published configuration: 466,416,416
parameters, which :func:`audio_numels` reproduces. ``load_weights`` skips every tensor named ``lora``: the
vision and speech LoRA adapters that Phi-4-multimodal ships are not loaded with the model (with
``--enable-lora`` they are served as adapters; LoRA is not modelled). ``video`` is not a Phi-4-multimodal
modality, so its limit stays vLLM's default of 999 unless set: the image encoder is skipped only when image
*and* video are limited to 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.planner.base import PlannerUnmodelledError

ARCHITECTURE = "Phi4MMForCausalLM"
# get_navit_vision_model's fixed SigLIP-so400m-patch14-448 config.
SIGLIP = {"hidden": 1152, "intermediate": 4304, "heads": 16, "patch": 14, "image": 448, "layers": 27}
IMAGE_MODALITIES = ("image", "video")
# Phi4MMProcessingInfo: the image with the most features is 448 x (448 x dynamic_hd); dynamic_hd is the
# processor's (preprocessor_config.json), 36 as Microsoft's Phi-4-multimodal samples write it.
DYNAMIC_HD = 36
# _AUDIO_MAX_SOUNDFILE_SIZE samples at 16 kHz: (241000 - 400) // 160 + 1 frames of 80 mel bins.
AUDIO_MAX_FRAMES = (241_000 - 400) // 160 + 1


@dataclass(frozen=True)
class ConformerAudio:
    """audio_processor.config's sizes (ConformerEncoder) and the language model's hidden size."""

    dim: int  # attention_dim
    heads: int
    ffn: int  # linear_units
    blocks: int
    input_size: int  # mel bins
    channels: int  # nemo_conv_settings.conv_channels
    time_reduction: int
    ext_pw_kernel: int
    kernel: int
    t5_max_distance: int
    compression_rate: int


def _int(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise PlannerUnmodelledError(
            f"config.json: audio_processor.config.{key}: found {value!r}; expected a positive integer"
        )
    return value


def parse_audio(config: Mapping[str, Any]) -> ConformerAudio:
    """The Conformer of ``audio_processor``; refuses the variants whose tensors the planner does not count."""
    processor = config.get("audio_processor")
    encoder = processor.get("config") if isinstance(processor, Mapping) else None
    if (
        not isinstance(processor, Mapping)
        or processor.get("name") != "cascades"
        or not isinstance(encoder, Mapping)
    ):
        raise PlannerUnmodelledError(
            "config.json: audio_processor: expected the 'cascades' Conformer with its config (vLLM 0.24's "
            "AudioEmbedding builds no other). Fix: size this deployment by hand"
        )
    embd = config.get("embd_layer")
    audio_layer = embd.get("audio_embd_layer") if isinstance(embd, Mapping) else None
    audio_layer = audio_layer if isinstance(audio_layer, Mapping) else {}
    dim = _int(encoder, "attention_dim", 256)
    nemo = encoder.get("nemo_conv_settings") or {}
    bias = encoder.get("relative_attention_bias_args") or {}
    unmodelled = {
        "input_layer": encoder.get("input_layer", "nemo_conv") != "nemo_conv",
        "nemo_conv_settings.subsampling": nemo.get("subsampling", "dw_striding") != "dw_striding",
        "relative_attention_bias_args.type": bias.get("type") != "t5" or bool(bias.get("t5_bias_symmetric")),
        "depthwise_seperable_out_channel": encoder.get("depthwise_seperable_out_channel", 256) != dim,
        "ext_pw_out_channel": encoder.get("ext_pw_out_channel", 0) != dim,
        "depthwise_multiplier": encoder.get("depthwise_multiplier", 1) != 1,
        "batch_norm": bool(encoder.get("batch_norm", False)),
        "linear_glu_in_convm": bool(encoder.get("linear_glu_in_convm", False)),
        "attention_group_size": encoder.get("attention_group_size", 1) != 1,
        "audio_embd_layer": bool(audio_layer.get("use_qformer") or audio_layer.get("use_conv_downsample"))
        or audio_layer.get("projection_cls", "linear") != "mlp",
    }
    found = [key for key, differs in unmodelled.items() if differs]
    if found:
        raise PlannerUnmodelledError(
            f"config.json: audio_processor: {', '.join(found)} differ from Phi-4-multimodal's Conformer; the "
            "planner counts only that shape. Fix: size this deployment by hand"
        )
    reduction = _int(encoder, "time_reduction", 4)
    if reduction & (reduction - 1):
        raise PlannerUnmodelledError(
            f"config.json: audio_processor.config.time_reduction: found {reduction}; expected a power of 2"
        )
    return ConformerAudio(
        dim=dim,
        heads=_int(encoder, "attention_heads", 4),
        ffn=_int(encoder, "linear_units", 2048),
        blocks=_int(encoder, "num_blocks", 6),
        input_size=_int(encoder, "input_size", 80),
        channels=_int(nemo, "conv_channels", 256),
        time_reduction=reduction,
        ext_pw_kernel=_int(encoder, "ext_pw_kernel_size", 1),
        kernel=_int(encoder, "kernel_size", 3),
        t5_max_distance=_int(bias, "t5_bias_max_distance", 1000),
        compression_rate=_int(audio_layer, "compression_rate", 8),
    )


def image_layers(config: Mapping[str, Any]) -> int:
    """``get_navit_vision_model(layer_idx)``: the layers kept up to the one whose features are used."""
    processor = config.get("img_processor")
    layer_idx = processor.get("layer_idx", -2) if isinstance(processor, Mapping) else -2
    layers = SIGLIP["layers"] + layer_idx + 1 if layer_idx < 0 else layer_idx + 1
    if not 0 < layers <= SIGLIP["layers"]:
        raise PlannerUnmodelledError(
            f"config.json: img_processor.layer_idx: found {layer_idx}; expected one of SigLIP's 27 layers"
        )
    return layers


def image_numels(layers: int, text_hidden: int, tp: int) -> list[int]:
    """Phi4MMImageEncoder's tensors on one tensor-parallel rank (element counts)."""
    hidden, patch = SIGLIP["hidden"], SIGLIP["patch"]
    inter = math.ceil(SIGLIP["intermediate"] / tp)
    width = math.ceil(SIGLIP["heads"] / tp) * (hidden // SIGLIP["heads"])
    layer = [2 * hidden, 3 * width * hidden, 3 * width, hidden * width, hidden, 2 * hidden]
    layer += [inter * hidden, inter, hidden * inter, hidden]
    numels = [hidden * 3 * patch * patch, hidden, (SIGLIP["image"] // patch) ** 2 * hidden]
    numels += layer * layers
    numels += [hidden, hidden]  # glb_GN, sub_GN
    numels += [text_hidden * hidden, text_hidden, text_hidden * text_hidden, text_hidden]  # img_projection
    return numels


def audio_numels(audio: ConformerAudio, text_hidden: int) -> list[int]:
    """AudioEmbedding's tensors (not sharded; every rank holds all of them)."""
    d, ffn, channels, k = audio.dim, audio.ffn, audio.channels, audio.ext_pw_kernel
    stages = int(math.log2(audio.time_reduction))
    embed = [channels * 9, channels]  # the first conv: 1 -> channels
    embed += [channels * 9, channels, channels * channels, channels] * (stages - 1)  # depthwise, pointwise
    embed += [d * channels * (audio.input_size // audio.time_reduction), d]  # out
    feed_forward = [2 * d, 2 * ffn * d, 2 * ffn, d * ffn, d]  # LayerNorm, GLU linear, second linear
    attention = [d * d, d] * 4
    conv = [2 * d, 2 * d, 2 * d * d * k, 2 * d, d * d * k, d]  # LayerNorm, GLU b1/b2 and conv, ext_pw_conv
    conv += [d * audio.kernel, d, d * d, d]  # depthwise-separable conv
    block = [*feed_forward, *feed_forward, *attention, *conv, 4 * d]  # layer_norm_att, layer_norm
    numels = [*embed, 2 * audio.t5_max_distance * audio.heads, 2 * audio.input_size]  # T5 biases, mean/invstd
    numels += block * audio.blocks
    numels += [text_hidden * d, text_hidden, text_hidden * text_hidden, text_hidden] * 2  # two projections
    return numels


def builds(limits: Mapping[str, int] | None, modalities: tuple[str, ...]) -> bool:
    """``_mark_tower_model``: a tower is skipped when every one of its modalities is limited to 0."""
    return any((limits or {}).get(modality, 999) > 0 for modality in modalities)


def max_image_tokens(dynamic_hd: int = DYNAMIC_HD) -> tuple[int, int]:
    """Tokens and crops of the image with the most features (``_compute_num_image_tokens`` for a
    448 x (448 x dynamic_hd) image: one column of dynamic_hd crops, 2x2 average-pooled, plus the global
    crop, its separator and the newline tokens)."""
    side = SIGLIP["image"] // SIGLIP["patch"] // 2  # 16 features per crop side after the pooling
    hd = side * side * dynamic_hd + side * dynamic_hd  # patches and one newline per row
    return side * side + 1 + hd + side, dynamic_hd + 1


def max_audio_tokens(audio: ConformerAudio) -> int:
    """``_compute_audio_embed_size`` for the dummy audio of ``_AUDIO_MAX_SOUNDFILE_SIZE`` samples."""
    return -(-AUDIO_MAX_FRAMES // audio.compression_rate)
