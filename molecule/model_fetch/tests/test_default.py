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


def test_no_relay_is_left_running(host):
    """Every receiver of the chain the control node streamed the bundle's model into has exited."""
    # grep over /proc (procps may be absent); the [y] keeps grep and its shell from matching themselves
    assert host.run("grep -ls 'gpufleet_rela[y]' /proc/[0-9]*/cmdline").stdout.strip() == ""
