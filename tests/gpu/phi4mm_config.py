"""A stand-in for Phi-4-multimodal-instruct's remote ``configuration_phi4mm.py`` (run on the GPU machine).

transformers 5.17 has no ``phi4mm`` model type and vLLM 0.24 ships no config class for it, so vLLM needs the
checkpoint's remote code (``--trust-remote-code``), which the GPU machine cannot download. planner_run.py
copies this file into the model directory as ``configuration_phi4mm.py`` and points ``auto_map`` at it. It
only keeps config.json's keys as attributes, with the defaults of the published class for the keys the
test config leaves out (the language model is Phi-4-mini's; vLLM builds it with LlamaModel). Written here,
not copied from the checkpoint; the image processor of the remote code is not provided.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "embd_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "img_processor": None,
    "audio_processor": None,
    "vision_lora": None,
    "speech_lora": None,
}


class Phi4MMConfig(PretrainedConfig):
    model_type = "phi4mm"

    def __init__(self, **kwargs: Any) -> None:
        for key, value in DEFAULTS.items():
            kwargs.setdefault(key, value)
        kwargs.setdefault("pad_token_id", 199999)
        kwargs.setdefault("bos_token_id", 199999)
        kwargs.setdefault("eos_token_id", 199999)
        super().__init__(**kwargs)
