"""What transformers fills in for keys a published config.json leaves out.

vLLM 0.24 reads config.json through transformers' config classes, so a key the file omits takes the class's
``__init__`` default (a key present with JSON null stays null, as when it is passed to the class). Gemma 3's
multimodal checkpoints rely on this: gemma-3-4b/12b/27b-it list only a few ``text_config`` keys (no
``vocab_size``, ``head_dim``, ``max_position_embeddings``, ...), which ``Gemma3Config`` turns into a
``Gemma3TextConfig``; Pixtral-12B's Hugging Face-format config (mistral-community/pixtral-12b) gives its
``vision_config`` no sizes at all, which ``PixtralVisionConfig`` supplies. The defaults below are those
classes' (transformers' ``configuration_gemma3.py`` and ``configuration_pixtral.py``); only the keys the
planner reads are listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["with_hf_defaults"]

# transformers' Gemma3TextConfig.__init__ (configuration_gemma3.py).
GEMMA3_TEXT: Mapping[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "rope_scaling": None,
    "rope_local_base_freq": 10_000.0,
    "sliding_window_pattern": 6,
}

# transformers' PixtralVisionConfig.__init__ (configuration_pixtral.py).
PIXTRAL_VISION: Mapping[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 1024,
    "patch_size": 16,
    "hidden_act": "gelu",
}

# model_type of a language model's config -> its config class's defaults.
TEXT_DEFAULTS: Mapping[str, Mapping[str, Any]] = {"gemma3_text": GEMMA3_TEXT}
# model_type of a multimodal wrapper -> the defaults of the class its text_config becomes, whatever the
# text_config's own model_type says (Gemma3Config builds a Gemma3TextConfig from the dict).
WRAPPED_TEXT_DEFAULTS: Mapping[str, Mapping[str, Any]] = {"gemma3": GEMMA3_TEXT}
# model_type of a vision_config -> its config class's defaults (LlavaConfig, Mistral3Config, ... build the
# class that model_type names).
VISION_DEFAULTS: Mapping[str, Mapping[str, Any]] = {"pixtral": PIXTRAL_VISION}


def with_hf_defaults(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config`` with the keys its config classes would fill in; the file's own keys win."""
    vision = config.get("vision_config")
    if isinstance(vision, Mapping) and (defaults := VISION_DEFAULTS.get(str(vision.get("model_type")))):
        config = {**config, "vision_config": {**defaults, **vision}}
    return _with_text_defaults(config)


def _with_text_defaults(config: Mapping[str, Any]) -> Mapping[str, Any]:
    wrapped = WRAPPED_TEXT_DEFAULTS.get(str(config.get("model_type")))
    if wrapped is not None:
        inner = config.get("text_config")
        if inner is None or isinstance(inner, Mapping):
            return {**config, "text_config": {**wrapped, **(inner or {})}}
        return config
    defaults = TEXT_DEFAULTS.get(str(config.get("model_type")))
    return {**defaults, **config} if defaults is not None else config
