"""The lab's tiny model (written without torch) and its local git-lfs remote laid out like ModelScope."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from gpufleet.bundle import sha256_file
from gpufleet.bundle.lfs import LfsServer, _range_start, lfs_object_path, make_lfs_repo
from gpufleet.lab.tiny_model import TinyModelSpec, read_safetensors_header, tensor_shapes, write_tiny_model

QWEN2_LAYER_WEIGHTS = {
    "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias",
    "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
}  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny-qwen2")


@pytest.fixture(scope="module")
def remote(model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return make_lfs_repo(model, tmp_path_factory.mktemp("remote"), "gpufleet/tiny-qwen2")


def test_model_directory_has_the_files_transformers_reads(model: Path) -> None:
    expected = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "configuration.json"}  # fmt: skip
    assert {path.name for path in model.iterdir()} == expected


def test_config_is_a_qwen2_with_the_lab_shapes(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (128, 2, 2)
    assert (config["num_key_value_heads"], config["vocab_size"], config["torch_dtype"]) == (
        2,
        2048,
        "bfloat16",
    )


def test_safetensors_header_names_every_qwen2_weight_in_bf16(model: Path) -> None:
    header = read_safetensors_header(model / "model.safetensors")
    names = set(header) - {"__metadata__"}
    layer_names = {f"model.layers.{n}.{suffix}" for n in range(2) for suffix in QWEN2_LAYER_WEIGHTS}
    assert names == layer_names | {"model.embed_tokens.weight", "model.norm.weight"}
    assert {entry["dtype"] for name, entry in header.items() if name != "__metadata__"} == {"BF16"}
    assert header["model.embed_tokens.weight"]["shape"] == [2048, 128]
    assert header["model.layers.0.self_attn.k_proj.weight"]["shape"] == [128, 128]


def test_safetensors_offsets_cover_the_data_exactly(model: Path) -> None:
    path = model / "model.safetensors"
    header = read_safetensors_header(path)
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    spans = sorted(tuple(entry["data_offsets"]) for name, entry in header.items() if name != "__metadata__")
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert 8 + header_len + spans[-1][1] == path.stat().st_size
    shapes = tensor_shapes(TinyModelSpec())
    for name, (start, end) in ((n, e["data_offsets"]) for n, e in header.items() if n != "__metadata__"):
        count = 1
        for dim in shapes[name]:
            count *= dim
        assert end - start == 2 * count, name


def test_tokenizer_has_chatml_specials_and_template(model: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    config = json.loads((model / "tokenizer_config.json").read_text())
    assert tokenizer.get_vocab_size() == 2048
    assert [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert "<|im_start|>" in config["chat_template"] and config["eos_token"] == "<|im_end|>"


def test_writing_twice_gives_identical_files(model: Path, tmp_path: Path) -> None:
    again = write_tiny_model(tmp_path / "again")
    for path in model.iterdir():
        assert sha256_file(path) == sha256_file(again / path.name), path.name


def test_remote_keeps_weights_in_lfs_like_modelscope(remote: tuple[Path, str], model: Path) -> None:
    bare, commit = remote
    oid = sha256_file(model / "model.safetensors")
    assert lfs_object_path(bare, oid).is_file()
    attributes = subprocess.run(["git", "-C", str(bare), "show", f"{commit}:.gitattributes"],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "*.safetensors filter=lfs diff=lfs merge=lfs -text" in attributes
    pointer = subprocess.run(["git", "-C", str(bare), "show", f"{commit}:model.safetensors"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert pointer.startswith("version https://git-lfs.github.com/spec/v1") and f"oid sha256:{oid}" in pointer


def test_remote_commit_is_deterministic(model: Path, remote: tuple[Path, str], tmp_path: Path) -> None:
    assert make_lfs_repo(model, tmp_path, "gpufleet/tiny-qwen2")[1] == remote[1]


def _clone(url: str, dest: Path) -> None:
    env = {**os.environ, "GIT_LFS_SKIP_SMUDGE": "1"}
    subprocess.run(["git", "clone", "--quiet", url, str(dest)], env=env, check=True)
    subprocess.run(["git", "-C", str(dest), "lfs", "pull"], check=True, capture_output=True)


def test_clone_over_file_url_fetches_lfs_objects(
    remote: tuple[Path, str], model: Path, tmp_path: Path
) -> None:
    _clone(remote[0].as_uri(), tmp_path / "clone")
    assert sha256_file(tmp_path / "clone/model.safetensors") == sha256_file(model / "model.safetensors")


def test_clone_over_http_uses_the_lfs_batch_api(
    remote: tuple[Path, str], model: Path, tmp_path: Path
) -> None:
    bare = remote[0]
    with LfsServer(bare.parents[1]) as server:
        _clone(f"{server.url}/gpufleet/tiny-qwen2.git", tmp_path / "clone")
        methods = [(method, path) for method, path, _ in server.log.requests]
    assert ("POST", "/gpufleet/tiny-qwen2.git/info/lfs/objects/batch") in methods
    assert sha256_file(tmp_path / "clone/model.safetensors") == sha256_file(model / "model.safetensors")


def test_interrupted_lfs_pull_keeps_finished_objects(
    remote: tuple[Path, str], model: Path, tmp_path: Path
) -> None:
    """git-lfs 3.3 restarts a half-downloaded object (its temp file has a random name) but keeps the
    finished ones: a rerun fetches only what is missing. The weights are slowed down so the tokenizer
    finishes and the weights do not."""
    bare, clone = remote[0], tmp_path / "clone"
    weights_oid, tokenizer_oid = (
        sha256_file(model / name) for name in ("model.safetensors", "tokenizer.json")
    )
    with LfsServer(bare.parents[1], rate=300_000) as server:
        env = {**os.environ, "GIT_LFS_SKIP_SMUDGE": "1"}
        subprocess.run(["git", "clone", "--quiet", f"{server.url}/gpufleet/tiny-qwen2.git", str(clone)],
                       env=env, check=True)  # fmt: skip
        pull = subprocess.Popen(["git", "-C", str(clone), "lfs", "pull"], stderr=subprocess.DEVNULL)
        try:
            pull.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pull.terminate()
            pull.wait()
        before = len(server.log.requests)
        server.rate = 0
        subprocess.run(["git", "-C", str(clone), "lfs", "pull"], check=True, capture_output=True)
        second = [path for _, path, _ in server.log.requests[before:]]
    assert any(path.endswith(weights_oid) for path in second)
    assert not any(path.endswith(tokenizer_oid) for path in second)
    assert sha256_file(clone / "model.safetensors") == weights_oid


@pytest.mark.parametrize(("header", "start"), [(None, 0), ("bytes=10-", 10), ("bytes=5000-", 0), ("x", 0)])
def test_range_start(header: str | None, start: int) -> None:
    assert _range_start(header, 1000) == start
