"""The lab's tiny model: a ModelScope-like Qwen2ForCausalLM directory written without torch.

Random bf16 weights go into ``model.safetensors`` written by hand (8-byte little-endian header length,
JSON header, raw tensor bytes); the tokenizer is a byte-level BPE trained offline with ``tokenizers`` on a
synthetic corpus made from a fixed seed, so the same call writes byte-identical files on every machine
(the lab bundle's lock and the model repository's commit depend on that).
"""

from __future__ import annotations

import json
import random
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Words the synthetic corpus is built from; chosen to give BPE plenty of shared sub-words.
_SYLLABLES = (
    "a e i o u an en in on un ar er ir or ur al el il ol ul at et it ot ut as es is os us "
    "th st ch sh qu pr tr gr br cr dr fr pl bl cl gl sl sp sc sk sm sn sw tw wh"
)
_SYLLABLE_LIST = _SYLLABLES.split()
_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a tiny model for the gpufleet lab.",
    "def main():\n    return 0\n",
    "GPU nodes serve models with vLLM across a Ray cluster.",
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shapes of the tiny model (the defaults match shared/reference/make_tiny_model.py)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    vocab_size: int = VOCAB_SIZE
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def corpus(seed: int = 0, lines: int = 4000) -> Iterator[str]:
    """Deterministic text: fixed sentences plus pseudo-words from a seeded generator."""
    rng = random.Random(seed)
    yield from _SENTENCES
    for _ in range(lines):
        words = ("".join(rng.choices(_SYLLABLE_LIST, k=rng.randint(1, 4))) for _ in range(rng.randint(4, 12)))
        yield " ".join(words) + rng.choice((".", ",", "!", "?", ":", "\n"))


def train_tokenizer(spec: TinyModelSpec) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` with the ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: PLC0415

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(spec.seed), trainer=trainer)
    return tokenizer


def tensor_shapes(spec: TinyModelSpec) -> dict[str, tuple[int, ...]]:
    """Every weight by its Hugging Face Qwen2 name (embeddings are tied, so no lm_head.weight)."""
    hidden, inter = spec.hidden_size, spec.intermediate_size
    kv = spec.num_key_value_heads * spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, hidden)}
    for n in range(spec.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.q_proj.bias": (hidden,),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def _bf16(values: array[float]) -> bytes:
    """float32 values to bf16 bytes (truncation: the upper 16 bits of each float32)."""
    as_int = array("I")
    as_int.frombytes(values.tobytes())
    return array("H", (v >> 16 for v in as_int)).tobytes()


def _tensor_bytes(name: str, count: int, rng: random.Random) -> bytes:
    """HF's Qwen2 initialisation: norms are ones, biases zeros, every other weight N(0, 0.02)."""
    if name.endswith("norm.weight"):
        return struct.pack("<H", 0x3F80) * count
    if name.endswith(".bias"):
        return b"\0\0" * count
    return _bf16(array("f", (rng.gauss(0.0, 0.02) for _ in range(count))))


def write_safetensors(path: Path, tensors: dict[str, tuple[tuple[int, ...], bytes]]) -> None:
    """Write bf16 tensors in the safetensors format; the header is padded to 8 bytes as the spec allows."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for _shape, data in tensors.values():
            out.write(data)


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (used by tests and by the model checks)."""
    with path.open("rb") as src:
        (length,) = struct.unpack("<Q", src.read(8))
        header: dict[str, Any] = json.loads(src.read(length))
    return header


def _config(spec: TinyModelSpec, pad_id: int, eos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.num_hidden_layers,
        "model_type": "qwen2",
        "num_attention_heads": spec.num_attention_heads,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_key_value_heads": spec.num_key_value_heads,
        "pad_token_id": pad_id,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec.vocab_size,
    }


def _tokenizer_config(tokenizer: Any, spec: TinyModelSpec) -> dict[str, Any]:
    decoder = {
        str(tokenizer.token_to_id(tok)): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tok in SPECIAL_TOKENS
    }
    return {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": spec.max_position_embeddings,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tiny_model(out: Path, spec: TinyModelSpec | None = None) -> Path:
    """Write the tiny model into ``out`` (created if needed); returns ``out``."""
    spec = spec or TinyModelSpec()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        spec = TinyModelSpec(**{**spec.__dict__, "vocab_size": tokenizer.get_vocab_size()})
    pad_id, eos_id = tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|im_end|>")
    rng = random.Random(spec.seed)
    tensors = {}
    for name, shape in tensor_shapes(spec).items():
        count = 1
        for dim in shape:
            count *= dim
        tensors[name] = (shape, _tensor_bytes(name, count, rng))
    write_safetensors(out / "model.safetensors", tensors)
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "config.json", _config(spec, pad_id, eos_id))
    _write_json(out / "tokenizer_config.json", _tokenizer_config(tokenizer, spec))
    _write_json(
        out / "special_tokens_map.json",
        {
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
        },
    )
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": pad_id,
            "do_sample": True,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "temperature": 1.0,
            "top_p": 1.0,
        },
    )
    (out / "configuration.json").write_text('{"framework": "pytorch", "task": "text-generation"}\n')
    return out
