"""Issue 37, a held-out batch: bad inputs the first round's tests did not try, each refused in one line of the
form WHERE: VARIABLE: found X; expected Y. Fix: Z (before: accepted, or a traceback, or a line with two Fix
parts)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli import main
from gpufleet.fleet import validate_inventory
from gpufleet.fleet.inventory import read_inventory
from gpufleet.problems import InventoryError

from .conftest import InventoryFactory, PdFactory, head_vars
from .test_commands_check_first import gpufleet, tripwire  # noqa: F401  (tripwire: the fixture)
from .test_validate_model_config import tp_with_config

FORM = re.compile(r"^[^\n]+: [^\n]+: found [^\n]+; expected [^\n]+\. Fix: [^\n]+$")


def lines(path: Path) -> list[str]:
    found = [str(problem) for problem in validate_inventory(path).problems]
    assert all(FORM.match(line) and line.count(". Fix: ") == 1 for line in found), found
    return found


# Role variables: (variable, value, what the line says). Before: accepted (the validator converts a list or a
# float to text, "k=v" to a mapping), or a traceback (inf where an integer belongs).
ROLE_VALUES: list[tuple[str, Any, str]] = [
    ("vllm_service_start_timeout", float("inf"), "not a finite number"),
    ("docker_wait_timeout", float("-inf"), "not a finite number"),
    ("ray_cluster_image", ["vllm/vllm-openai:v0.24.0"], "a list where text belongs"),
    ("ray_cluster_image", {"name": "vllm"}, "a mapping where text belongs"),
    ("nvidia_driver_version", 580.95, "YAML read the number 580.95"),
    ("cuda_toolkit_version", 12.1, "quote the text"),
    ("ray_cluster_image", True, "YAML read a boolean"),
    ("ray_cluster_image", "vllm/vllm-openai:v0.24.0\n", "control characters"),
    ("vllm_service_config", "block-size=16", "not written as a mapping"),
    ("ray_cluster_docker_args", "--shm-size 10g", "not written as a list"),
    ("docker_users", [{"name": "bob"}], "item 0: a mapping where text belongs"),
    ("docker_registry_mirrors", ["https://m.example", True], "item 1: YAML read a boolean"),
    ("ansible_port", "22/tcp", "not convertible to int"),
    ("ansible_port", 0, "from 1 to 65535"),
    ("ansible_user", ["root"], "a list where text belongs"),
    # environment files, one NAME=VALUE line per item, unquoted: a newline added a line (VLLM_API_KEY=...)
    ("vllm_service_env", {"NCCL_DEBUG": "INFO\nVLLM_API_KEY=x"}, "'NCCL_DEBUG': control characters"),
    ("vllm_service_env", {"NCCL DEBUG": "INFO"}, "not an environment variable's name"),
    ("ray_cluster_env", {"A": [1, 2]}, "'A': a list where text belongs"),
    ("vllm_service_env", {"VLLM_USE_V1": True}, "'VLLM_USE_V1': YAML read a boolean"),
    ("docker_service_environment", {"HTTP_PROXY": 1.10}, "YAML read the number 1.1"),
]


@pytest.mark.parametrize(
    ("name", "value", "said"), ROLE_VALUES, ids=[f"{n}={v!r}" for n, v, _ in ROLE_VALUES]
)
def test_a_role_value_as_written_is_what_the_role_reads(
    make_inventory: InventoryFactory, name: str, value: Any, said: str
) -> None:
    found = [line for line in lines(make_inventory(group_vars={name: value})) if f": {name}: found " in line]
    assert len(found) == 1 and said in found[0], found


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("cuda_toolkit_version", "12.10"),
        ("ray_cluster_image", "img:1"),
        ("vllm_service_env", {"OMP_NUM_THREADS": 8, "NCCL_DEBUG": "INFO"}),
    ],
)
def test_quoted_text_is_taken(make_inventory: InventoryFactory, name: str, value: Any) -> None:
    assert lines(make_inventory(group_vars={name: value})) == []


# Node addresses no peer can use. Before: accepted by validate and written by init.
ADDRESSES = [("fe80::1", "link-local"), ("169.254.10.1", "link-local"), ("::ffff:127.0.0.1", "loopback")]


@pytest.mark.parametrize(("address", "kind"), ADDRESSES)
def test_a_node_address_no_peer_can_use_is_refused(
    make_inventory: InventoryFactory, address: str, kind: str
) -> None:
    path = make_inventory(edit_hosts=lambda hosts: head_vars(hosts).update(gpufleet_node_ip=address))
    found = [line for line in lines(path) if "gpufleet_node_ip" in line]
    assert len(found) == 1 and f"not a {kind} one" in found[0], found


@pytest.mark.parametrize(("address", "_kind"), ADDRESSES)
def test_init_writes_no_node_address_validate_refuses(
    tmp_path: Path, address: str, _kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "new"
    args = ["init", str(target), "--head", f"h={address}", "--model", "Qwen/Qwen2.5-1.5B-Instruct"]
    assert main([*args, "--gpu", "NVIDIA H800", "--gpu-memory-gib", "79.18"]) == 2
    assert "gpufleet_node_ip" in capsys.readouterr().err and not target.exists()


# Control characters in a schema string. Before: accepted (a model dir with a newline, a GPU model with ESC).
@pytest.mark.parametrize(
    ("name", "value"), [("gpufleet_model_dir", "/opt/models/a\nb"), ("gpufleet_model_revision", "main\t")]
)
def test_control_characters_in_fleet_settings_are_refused(
    make_inventory: InventoryFactory, name: str, value: str
) -> None:
    found = [line for line in lines(make_inventory(group_vars={name: value})) if f": {name}: " in line]
    assert len(found) == 1 and "control characters" in found[0], found


def test_init_refuses_a_gpu_model_with_an_escape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["init", str(tmp_path / "new"), "--head", "h=10.0.0.1", "--model", "Qwen/Qwen2.5-1.5B-Instruct"]
    assert main([*args, "--gpu", "NVIDIA\x1bH800", "--gpu-memory-gib", "79.18"]) == 2
    assert "control characters" in capsys.readouterr().err


# A P/D role's serving keys are the schema's (block_size), not vLLM's spelling of them: any other key is
# refused in one line naming it. Before (the pools' vllm_pd_config): block_size escaped the pools' checks.
@pytest.mark.parametrize("key", ["block-size", "Block_Size", 16, "16"])
def test_a_pd_roles_serving_key_that_is_not_the_schemas_is_refused(pd_example: PdFactory, key: Any) -> None:
    def edit(service: dict[str, Any]) -> None:
        service["pd"]["decode"]["serving"][key] = 32

    found = lines(pd_example(edit))
    assert any(f": pd.decode.serving.{key}: found 32" in line for line in found), found


# config.json sections of the wrong kind (before: accepted) and the planner's line not wrapped in another one
# (before: "...Fix: the model's own config.json has them; expected the model's own config.json. Fix: ...").
@pytest.mark.parametrize(
    ("section", "value"),
    [
        ("rope_scaling", [1, 2]),
        ("rope_scaling", "linear"),
        ("quantization_config", "awq"),
        ("text_config", [1]),
    ],
)
def test_a_config_section_that_is_no_object_is_refused(tmp_path: Path, section: str, value: Any) -> None:
    found = lines(tp_with_config(tmp_path, **{section: value}))
    assert len(found) == 1 and f": {section}: found {value!r}; expected a JSON object" in found[0], found


def test_a_planner_refusal_is_one_line_naming_the_file_and_key(tmp_path: Path) -> None:
    config = json.loads((Path(__file__).parents[2] / "models/Qwen2.5-1.5B-Instruct/config.json").read_text())
    moe = config | {"num_local_experts": 8, "num_experts_per_tok": 16}
    (line,) = lines(tp_with_config(tmp_path, whole=moe))
    assert line.startswith(
        str(tmp_path / "config.json") + ": num_experts_per_tok: found 16 with 8 experts"
    ), line


# A --limit whose parts each select hosts but which together select none. Before: Ansible ran the stage on no
# host ("[ERROR]: ... leaves us with no hosts to target", a failed preflight line not in the problem form).
@pytest.mark.parametrize("pattern", ["all:!gpu_nodes", "ray_head:&ray_workers", "head:!head"])
@pytest.mark.parametrize("command", ["deploy", "teardown"])
def test_a_limit_that_together_selects_no_host_is_refused(
    make_inventory: InventoryFactory,
    tripwire: list[str],  # noqa: F811  (the fixture imported above)
    capsys: pytest.CaptureFixture[str],
    command: str,
    pattern: str,
) -> None:
    code, problems = gpufleet(capsys, command, "-i", str(make_inventory()), "--limit", pattern)
    assert code == 2 and tripwire == [], (code, problems)
    assert problems[0].startswith(f"command line: --limit: found {pattern}, which selects no host"), problems


# A YAML syntax error in a vars file. Before: "host head: group_vars / host_vars: found YAML parsing failed:
# Tabs are usually invalid in YAML.; ... Fix: make each group_vars/host_vars file a mapping ..., not a list":
# no file, no line, and a fix for another mistake.
@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("vllm_service_port: 8000\n\tvllm_service_block_size: 16\n", 2),
        ("vllm_service_served_model_name: 'qwen\nvllm_service_port: 8000\n", 3),
        ("vllm_service_port: [8000\n", 2),
    ],
)
def test_a_yaml_syntax_error_in_a_vars_file_names_the_file_and_line(
    make_inventory: InventoryFactory, text: str, line: int
) -> None:
    path = make_inventory()
    (path / "group_vars" / "all.yml").write_text(text, encoding="utf-8")
    with pytest.raises(InventoryError) as refused:
        read_inventory(path)
    (problem,) = refused.value.problems
    assert problem.where == f"{path / 'group_vars' / 'all.yml'}:{line}", problem
    assert FORM.match(str(problem)) and "not a list" not in str(problem), problem
