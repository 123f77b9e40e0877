"""The package's shape: no import cycle anywhere in src/gpufleet, the lab stays a tool, and the runner's
modules stay small.

Every import counts, including those under ``if TYPE_CHECKING:`` and inside functions: a type-only or a
deferred cycle is still two modules that cannot be understood (or moved) one without the other.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "gpufleet"
# The CLI's `gpufleet lab` and `gpufleet demo` commands are the lab's entry points, and the lab itself.
MAY_IMPORT_LAB = ("gpufleet.lab", "gpufleet.commands.lab", "gpufleet.commands.demo")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """gpufleet modules ``path`` imports (``from pkg import sub``: ``pkg.sub`` when that is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{alias.name}" for alias in node.names} & known
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(node.module)
    return {name for name in found if name in known}


@functools.cache
def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(path, set(known)) - {name} for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path of module names (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_there_is_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above must be able to fail: a two-module and a type-only three-module cycle."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_reader_sees_type_only_and_deferred_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gpufleet.planner.core import Plan\n"
        "def f():\n    from gpufleet.lab import host\n"
    )
    known = {"gpufleet.planner.core", "gpufleet.lab", "gpufleet.lab.host"}
    assert imports_of(source, known) == {"gpufleet.planner.core", "gpufleet.lab.host"}


@pytest.mark.parametrize("name", sorted(n for n in modules() if not n.startswith(MAY_IMPORT_LAB)))
def test_product_modules_do_not_import_the_lab(name: str) -> None:
    graph = import_graph()
    lab = sorted(
        target for target in graph[name] if target == "gpufleet.lab" or target.startswith("gpufleet.lab.")
    )
    assert not lab, f"{name} imports {lab}: the lab is a test tool; move what both need out of gpufleet.lab"


def test_every_subpackage_declares_its_public_surface() -> None:
    for init in PACKAGE.glob("*/__init__.py"):
        if init.parent.name == "commands":
            continue  # the CLI's sub-command modules, found by name; no API
        tree = ast.parse(init.read_text())
        names = [
            t.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        ]
        assert "__all__" in names, f"{init}: no __all__"


RUNNER = PACKAGE / "runner"
MAX_RUNNER_LINES = 400  # issue 34: modules of one concern; core.py had grown to 984 lines of five


def too_long(folder: Path, limit: int) -> list[str]:
    """The modules of ``folder`` over ``limit`` lines, each with its count."""
    counts = {path.name: len(path.read_text().splitlines()) for path in sorted(folder.glob("*.py"))}
    return [f"{name}: {count} lines" for name, count in counts.items() if count > limit]


def test_no_runner_module_is_over_400_lines() -> None:
    too_long_now = too_long(RUNNER, MAX_RUNNER_LINES)
    assert too_long_now == [], "split each by concern (docs/conventions.md, the runner's modules)"


def test_the_length_check_finds_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "short.py").write_text("x = 1\n" * 400)
    (tmp_path / "long.py").write_text("x = 1\n" * 401)
    assert too_long(tmp_path, MAX_RUNNER_LINES) == ["long.py: 401 lines"]


REPO = SRC.parent
ROLES = sorted(path.name for path in (REPO / "roles").iterdir() if path.is_dir())


def role_internals_read(text: str, roles: list[str]) -> list[str]:
    """The ``__<role>_*`` names ``text`` uses: a role's internals (vars/main.yml, its registered results)."""
    names = set(re.findall(r"\b__([a-z0-9_]+)", text))
    return sorted(f"__{name}" for name in names if any(name.startswith(f"{role}_") for role in roles))


@pytest.mark.parametrize(
    "playbook",
    sorted(p.relative_to(REPO).as_posix() for p in [*REPO.glob("playbooks/*.yml"), REPO / "site.yml"]),
)
def test_no_playbook_reads_a_roles_internals(playbook: str) -> None:
    """Issue 34: playbooks use a role's entry points and its documented outputs (vllm_service_instance,
    vllm_service_gate_result, vllm_service_restored, ray_cluster_report), never its ``__`` variables."""
    found = role_internals_read((REPO / playbook).read_text(encoding="utf-8"), ROLES)
    assert found == [], f"{playbook} reads {found}: use the role's entry points and outputs (its README)"


def test_the_internals_check_finds_a_read() -> None:
    text = 'url: "{{ __vllm_service_url }}"\nmine: "{{ __verify_chat }}"\nray: "{{ __ray_cluster_status }}"'
    assert role_internals_read(text, ROLES) == ["__ray_cluster_status", "__vllm_service_url"]


def role_code(role: str) -> str:
    """What a role runs: its tasks, handlers, vars, defaults and templates."""
    folder = REPO / "roles" / role
    parts = ("tasks/*.yml", "handlers/*.yml", "vars/*.yml", "defaults/*.yml", "templates/*")
    return "\n".join(path.read_text(encoding="utf-8") for part in parts for path in sorted(folder.glob(part)))


@pytest.mark.parametrize("role", ROLES)
def test_no_role_reads_another_roles_internals(role: str) -> None:
    """Issue 34: a role calls another through its argument spec and reads its documented outputs (the relay's
    relay_probe_reached); model_fetch once read image_distribution's __image_distribution_probe_reached."""
    found = role_internals_read(role_code(role), [other for other in ROLES if other != role])
    assert found == [], f"roles/{role} reads {found}: use that role's entry points and outputs (its README)"


def test_the_role_internals_check_sees_a_role_reading_another() -> None:
    text = "when: __image_distribution_probe_reached | default(false)\nport: '{{ __model_fetch_seed }}'"
    assert role_internals_read(text, [role for role in ROLES if role != "model_fetch"]) == [
        "__image_distribution_probe_reached"
    ]
