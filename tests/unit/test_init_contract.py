"""`gpufleet init` writes only what `gpufleet validate` accepts (issue 37, class 2).

init renders the inventory in memory, has ansible-core read it and runs validation on that reading (the same
checks as `gpufleet validate`: the schema, the group rules, the planner) plus the rule that a host is not
named like a group; it refuses with one line per problem, naming the option to change, and writes nothing.

Before: a host name ending in a newline, a NIC name with ": " or " #" in it (YAML that no longer parses, or
a NIC silently cut short), hosts named like a group, a model id, a GPU count or a GPU memory outside the
schema, a GPU model with no known memory, an IPv6 address YAML reads as a number, and a fleet too small for
the model were all written; validate then refused most of them (one it accepted silently changed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.commands import init as init_command
from gpufleet.fleet import validate_inventory
from gpufleet.fleet.inventory import read_inventory

CONFIG = Path(__file__).resolve().parents[2] / "models" / "Qwen2.5-1.5B-Instruct" / "config.json"
GOOD = {
    "--head": "gpu-head-01=192.0.2.10,10.10.0.10",
    "--model": "Qwen/Qwen2.5-1.5B-Instruct",
    "--gpu": "NVIDIA H800",
    "--gpus-per-node": "1",
    "--gpu-memory-gib": "79.18",
}
LINE = re.compile(r"^gpufleet init: .+: found .+; expected .+\. Fix: .+$", re.DOTALL)


def arguments(directory: Path, changes: dict[str, str | None], *extra: str) -> list[str]:
    options = GOOD | changes
    args = ["init", str(directory)]
    for option, value in options.items():
        if value is not None:
            args += [option, value]
    return [*args, *extra]


def refused(
    directory: Path, changes: dict[str, str | None], capsys: pytest.CaptureFixture[str], *extra: str
) -> list[str]:
    code = main(arguments(directory, changes, *extra, "--json"))
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["ok"] is False, out
    return list(out["problems"])


REFUSED: dict[str, tuple[dict[str, str | None], str, str]] = {
    # case: (options changed, the option the message names, a word of what it found or expected)
    "host name ending in a newline": ({"--head": "gpu-head-01\n=192.0.2.10"}, "--head", "host name"),
    "host name with a tab": ({"--head": "gpu\thead=192.0.2.10"}, "--head", "host name"),
    "host named like the group gpu_nodes": ({"--head": "gpu_nodes=192.0.2.10"}, "--head", "group"),
    "host named like the group ray_workers": ({"--head": "ray_workers=192.0.2.10"}, "--head", "group"),
    "host named all": ({"--head": "all=192.0.2.10"}, "--head", "group"),
    "worker named like the group ray_head": ({"--worker": "ray_head=192.0.2.11"}, "--worker", "group"),
    "NIC with a colon and a space": ({"--nic": "eth0: x"}, "--nic", "eth0: x"),
    "NIC with a comment": ({"--nic": "eth0 #x"}, "--nic", "eth0 #x"),
    "NIC with a newline": ({"--nic": "eth0\nx: 1"}, "--nic", "gpufleet_nic"),
    "NIC longer than 15 bytes": ({"--nic": "a" * 16}, "--nic", "gpufleet_nic"),
    "model id starting with _": ({"--model": "_org/name"}, "--model", "gpufleet_model_repo"),
    "model id with a non-ASCII letter": ({"--model": "Ωrg/name"}, "--model", "gpufleet_model_repo"),
    "more GPUs per node than the schema's 64": ({"--gpus-per-node": "100"}, "--gpus-per-node", "64"),
    "GPU memory above the schema's 1024 GiB": ({"--gpu-memory-gib": "2000"}, "--gpu-memory-gib", "1024"),
    "a GPU model with no known memory": (
        {"--gpu": "NVIDIA B200", "--gpu-memory-gib": None},
        "--gpu-memory-gib",
        "memory",
    ),
    "a GPU too small for the model": ({"--gpu-memory-gib": "1"}, "--gpu-memory-gib", "planner"),
}


# Each form init writes: services (the default) and the one-model form.
FORMS = {"services": (), "one instance": ("--one-instance",)}
# A word of a case that names another variable in the services form.
IN_SERVICES = {"gpufleet_model_repo": "gpufleet_services[].model.repo"}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_init_refuses_what_validate_would_refuse_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, form: str
) -> None:
    changes, option, word = REFUSED[case]
    word = IN_SERVICES.get(word, word) if form == "services" else word
    if "--worker" in changes:  # a worker is added, not replaced
        changes = changes | {"--head": GOOD["--head"]}
    if case == "a GPU too small for the model":
        problems = refused(tmp_path / "inv", changes | {"--model-config": str(CONFIG)}, capsys, *FORMS[form])
    else:
        problems = refused(tmp_path / "inv", changes, capsys, *FORMS[form])
    assert problems and all(LINE.match(problem) for problem in problems), problems
    assert any(option in problem and word in problem for problem in problems), problems
    assert not (tmp_path / "inv").exists()


def test_a_refused_force_leaves_the_inventory_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(arguments(tmp_path / "inv", {})) == 0
    before = {path: path.read_bytes() for path in (tmp_path / "inv").rglob("*") if path.is_file()}
    capsys.readouterr()
    code = main(arguments(tmp_path / "inv", {"--nic": "eth0: x"}, "--force"))
    assert code == 2 and "--nic" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in (tmp_path / "inv").rglob("*") if path.is_file()} == before


@pytest.mark.parametrize(
    ("changes", "variable", "value"),
    [
        ({"--head": "gpu-head-01=1:2:3:4:5:6:7:8"}, "ansible_host", "1:2:3:4:5:6:7:8"),
        ({"--head": "123=192.0.2.10"}, "inventory_hostname", "123"),
        ({"--nic": "123"}, "gpufleet_nic", "123"),
        ({"--nic": "1e3"}, "gpufleet_nic", "1e3"),
        ({"--gpu": "null"}, "gpufleet_gpu_model", "null"),
    ],
    ids=[
        "IPv6 YAML reads as a number",
        "host name YAML reads as a number",
        "NIC of digits",
        "NIC YAML reads as a float",
        "GPU named null",
    ],
)
def test_what_init_writes_reads_back_as_given(
    tmp_path: Path, changes: dict[str, str | None], variable: str, value: str
) -> None:
    """Values YAML would read as something else are written so that Ansible reads them as given."""
    assert main(arguments(tmp_path / "inv", changes)) == 0
    result = validate_inventory(tmp_path / "inv")
    assert result.problems == [], result.problems
    (head,) = read_inventory(tmp_path / "inv").members("ray_head")
    assert (head.name if variable == "inventory_hostname" else head.variables[variable]) == value


def test_a_value_ansible_would_read_differently_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check compares Ansible's reading with what was given: were a value written unquoted (a template
    change), YAML's null would slip through validation as "no GPU model"; init refuses it instead."""
    monkeypatch.setattr(init_command, "yaml_scalar", str)
    problems = refused(tmp_path / "inv", {"--gpu": "null"}, capsys)
    assert any("--gpu" in problem and "None" in problem for problem in problems), problems
    assert not (tmp_path / "inv").exists()


def test_a_directory_name_with_a_line_break_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init writes DIR into the files' comments: a line break there would make YAML of the rest."""
    problems = refused(tmp_path / "inv\nray_head: 1", {}, capsys)
    assert any("DIR" in problem for problem in problems), problems
    assert list(tmp_path.iterdir()) == []


def test_a_directory_init_cannot_create_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a traceback: a DIR nobody may create (under /proc, which refuses even root)."""
    problems = refused(Path("/proc/gpufleet-init-test/inv"), {}, capsys)
    assert len(problems) == 1 and LINE.match(problems[0]) and "DIR" in problems[0], problems


def test_a_model_config_nested_too_deep_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a RecursionError traceback from json.loads."""
    config = tmp_path / "config.json"
    config.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    problems = refused(tmp_path / "inv", {"--model-config": str(config)}, capsys)
    assert len(problems) == 1 and LINE.match(problems[0]) and "--model-config" in problems[0], problems
    assert not (tmp_path / "inv").exists()
