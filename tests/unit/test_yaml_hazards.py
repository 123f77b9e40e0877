"""YAML hazards in an inventory fail fast with one clear line, never a hang or a traceback (issue 37, 6).

An alias bomb ("billion laughs": nine anchors, each a list of nine aliases of the one before, a billion
strings once expanded), very deep nesting and a very large file, in the hosts file, in group_vars or in
host_vars, are refused by gpufleet's own pass over the files (:mod:`gpufleet.fleet.yaml_guard`) before
ansible-core's loader sees them, through every command that reads an inventory.

Before: the alias bomb hung (Ansible's templating expanded it), deep nesting was a RecursionError traceback
from the duplicate-key pass, and a 5 MiB file was read (and a 1 GiB one would have been read whole).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gpufleet.cli import main
from gpufleet.fleet import validate_inventory, yaml_guard
from gpufleet.fleet.inventory import read_inventory
from gpufleet.problems import InventoryError

from .conftest import InventoryFactory

PROBLEM = re.compile(r"^.+: -i: found .+; expected .+\. Fix: .+$")
SECONDS = 20  # "fast": each case takes well under a second; the machine is shared


def alias_bomb() -> str:
    """Nine anchors, each a list of nine aliases of the one before: 9**9 strings once expanded."""
    lines = ['lol0: &lol0 "lol"']
    lines += [f"lol{n}: &lol{n} [{', '.join([f'*lol{n - 1}'] * 9)}]" for n in range(1, 10)]
    return "\n".join(lines) + "\n"


def deep_nesting(levels: int = 100_000) -> str:
    return "deep: " + "[" * levels + "]" * levels + "\n"


def large_file() -> str:
    """Valid YAML (a comment) a little over 5 MiB."""
    return ("# " + "x" * 1022 + "\n") * 5 * 1024 + "gpufleet_lab: false\n"


HAZARDS: dict[str, tuple[Callable[[], str], str]] = {
    "alias bomb": (alias_bomb, "aliases"),
    "deep nesting": (deep_nesting, "levels"),
    "large file": (large_file, "bytes"),
}


def indented(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in text.splitlines())


def place(inventory: Path, where: str, text: str) -> Path:
    """Put ``text`` (YAML variables) into the inventory's hosts file, group_vars or host_vars."""
    if where == "hosts file":
        hosts = inventory / "hosts.yml"
        hosts.write_text(hosts.read_text() + "all:\n  vars:\n" + indented(text, 4), encoding="utf-8")
        return hosts
    folder = inventory / where
    folder.mkdir(exist_ok=True)
    target = folder / ("all.yml" if where == "group_vars" else "head.yml")
    target.write_text(text, encoding="utf-8")
    return target


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["hosts file", "group_vars", "host_vars"])
@pytest.mark.parametrize("hazard", sorted(HAZARDS))
def test_validate_refuses_a_yaml_hazard_fast_naming_the_file(
    make_inventory: InventoryFactory, hazard: str, where: str
) -> None:
    build, said = HAZARDS[hazard]
    inventory = make_inventory()
    file = place(inventory, where, build())

    started = time.monotonic()
    result = validate_inventory(inventory)
    elapsed = time.monotonic() - started

    assert elapsed < SECONDS, f"{hazard} in the {where} took {elapsed:.1f} s"
    assert result.fleet is None
    (problem,) = result.problems
    assert problem.where.startswith(str(file)), problem
    assert said in problem.found and PROBLEM.match(str(problem)), problem


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "command",
    [
        ["validate", "--json", "-i"],
        ["plan", "--json", "-i"],
        ["deploy", "--json", "-i"],
    ],
    ids=["validate", "plan", "deploy"],
)
def test_every_command_that_reads_an_inventory_refuses_an_alias_bomb(
    make_inventory: InventoryFactory, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = make_inventory()
    place(inventory, "group_vars", alias_bomb())

    code = main([*command, str(inventory)])

    out = capsys.readouterr().out
    assert code == 1, out
    assert "aliases" in out and "expand" in out and "Traceback" not in out
    document = json.loads(out)
    assert document.get("ok", document.get("valid")) is False


@pytest.mark.timeout(60)
def test_a_huge_file_is_never_read_whole(tmp_path: Path, make_inventory: InventoryFactory) -> None:
    """A 64 GiB (sparse) file in group_vars: refused from its first bytes, in well under a second."""
    inventory = make_inventory()
    huge = inventory / "group_vars" / "all.yml"
    with huge.open("wb") as handle:
        handle.truncate(64 * 1024**3)

    started = time.monotonic()
    with pytest.raises(InventoryError) as raised:
        read_inventory(inventory)

    assert time.monotonic() - started < 5
    (problem,) = raised.value.problems
    assert problem.where == str(huge)
    assert f"{64 * 1024**3:,} bytes" in problem.found
    assert f"at most {yaml_guard.MAX_FILE_BYTES:,} bytes" in problem.expected


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (deep_nesting(yaml_guard.MAX_DEPTH), "nested"),
        (
            "a: &a [1, 2]\n"
            + "".join(
                f"b{n}: [{', '.join(['*a'] * 1000)}]\n" for n in range(yaml_guard.MAX_NODES // 3000 + 1)
            ),
            "aliases",
        ),
    ],
    ids=["one level too deep", "many small aliases"],
)
def test_the_limits_are_exact(text: str, said: str, tmp_path: Path) -> None:
    """Just over a limit is refused (the limits are what the message says); just under is read."""
    file = tmp_path / "vars.yml"
    problem = yaml_guard.hazard(file, text.encode())
    assert problem is not None and said in problem.found
    under = deep_nesting(yaml_guard.MAX_DEPTH - 1) if said == "nested" else "a: &a [1, 2]\nb: [*a, *a]\n"
    assert yaml_guard.hazard(file, under.encode()) is None


def test_an_inventory_nested_to_the_limit_reads_without_a_traceback(make_inventory: InventoryFactory) -> None:
    """The depth allowed is one Ansible's loader and templating (and gpufleet's) can read."""
    inventory = make_inventory(
        group_vars={"user_deep": yaml.safe_load(deep_nesting(yaml_guard.MAX_DEPTH - 2))}
    )
    result = validate_inventory(inventory)
    assert result.problems == [], result.problems


def test_ordinary_anchors_and_merge_keys_still_read(make_inventory: InventoryFactory) -> None:
    inventory = make_inventory()
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "head.yml").write_text(
        "user_defaults: &defaults {retries: 3, delay: 5}\nuser_probe:\n  <<: *defaults\n  delay: 7\n",
        encoding="utf-8",
    )
    (head,) = [host for host in read_inventory(inventory).hosts if host.name == "head"]
    assert head.variables["user_probe"] == {"retries": 3, "delay": 7}
