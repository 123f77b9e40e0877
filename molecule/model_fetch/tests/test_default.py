"""After converge: every node holds the tiny model with a marker whose sha256s match the files."""

import json


def test_model_files_match_the_marker(host):
    marker = json.loads(host.file("/opt/models/tiny-qwen2/.gpufleet-model.json").content_string)
    assert marker["repo"] == "gpufleet/tiny-qwen2"
    for name, entry in marker["files"].items():
        assert host.file(f"/opt/models/tiny-qwen2/{name}").sha256sum == entry["sha256"], name


def test_model_is_a_qwen2(host):
    config = json.loads(host.file("/opt/models/tiny-qwen2/config.json").content_string)
    assert config["architectures"] == ["Qwen2ForCausalLM"]
