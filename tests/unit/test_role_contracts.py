"""Every role keeps its argument specs, its defaults, the pydantic models and the README in agreement,
and reads like the house style: main.yml a tagged stage index, includes at most three deep, tags named for
the role, systemd units validated before they replace the old ones, the bundle lock read only by the lookup
plugin.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpufleet
from gpufleet.docs import render
from gpufleet.fleet.schema import INTERNAL_ROLES, VARIABLES, ServingSpec

from .conftest import REPO

ROLES = sorted(path.name for path in (REPO / "roles").iterdir() if path.is_dir())
MAX_INCLUDE_DEPTH = 3  # main.yml -> stage file -> sub-file
TASK_INCLUDES = (
    "ansible.builtin.include_tasks",
    "ansible.builtin.import_tasks",
    "include_tasks",
    "import_tasks",
)
ROLE_INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")
TEMPLATE_MODULES = ("ansible.builtin.template", "template")
UNIT_SUFFIXES = (".service", ".socket", ".timer", ".mount", ".path", ".target", ".slice")
MESSAGE_KEYS = frozenset({"name", "msg", "fail_msg", "success_msg"})
LOCK_PLUGIN = "gpufleet_bundle_lock"
LOCK_LOOKUP = re.compile(r"\b(?:lookup|query|q)\s*\([^)]*bundle\.lock")
PATH_KEYS = frozenset({"path", "src", "file", "dest", "_raw_params"})


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def task_files(role: str) -> list[Path]:
    role_dir = REPO / "roles" / role
    return sorted([*role_dir.glob("tasks/*.yml"), *role_dir.glob("handlers/*.yml")])


def tasks_in(items: list[dict[str, Any]] | None) -> Iterator[dict[str, Any]]:
    """Every task and block of a task list, blocks' tasks included."""
    for item in items or []:
        yield item
        for key in ("block", "rescue", "always"):
            yield from tasks_in(item.get(key))


def included_file(task: dict[str, Any]) -> str | None:
    for key in TASK_INCLUDES:
        if key in task:
            value = task[key]
            return str(value if isinstance(value, str) else value["file"])
    return None


def entry_points(role: str) -> list[Path]:
    """main.yml, handlers/main.yml and every file another role or a playbook enters by tasks_from."""
    roots = [REPO / "roles" / role / "tasks" / "main.yml", REPO / "roles" / role / "handlers" / "main.yml"]
    for path in sorted([*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/*.yml")]):
        for play_or_task in tasks_in(load(path)):
            for task in tasks_in(play_or_task.get("tasks")) if "hosts" in play_or_task else [play_or_task]:
                for key in ROLE_INCLUDES:
                    args = task.get(key) or {}
                    if args.get("name") == role and "tasks_from" in args:
                        name = str(args["tasks_from"])
                        roots.append(
                            REPO
                            / "roles"
                            / role
                            / "tasks"
                            / (name if name.endswith(".yml") else f"{name}.yml")
                        )
    return sorted(set(roots))


def include_chains(chain: tuple[Path, ...]) -> Iterator[tuple[Path, ...]]:
    """Every path from chain[0] through include_tasks/import_tasks down to a file that includes nothing."""
    tasks_dir = chain[0].parents[1] / "tasks"
    children = [tasks_dir / name for task in tasks_in(load(chain[-1])) if (name := included_file(task))]
    if not children:
        yield chain
    for child in children:
        assert child.is_file(), f"{chain[-1].relative_to(REPO)} includes {child.name}, which does not exist"
        assert child not in chain, f"include cycle: {' -> '.join(p.name for p in (*chain, child))}"
        yield from include_chains((*chain, child))


def tags_of(task: dict[str, Any]) -> list[str]:
    tags = list(task.get("tags") or [])
    for key in TASK_INCLUDES:
        if isinstance(task.get(key), dict):
            tags += (task[key].get("apply") or {}).get("tags") or []
    return [tags] if isinstance(tags, str) else [str(tag) for tag in tags]


def role_variables(role: str) -> dict[str, Any]:
    variables: dict[str, Any] = {}
    for relative in ("defaults/main.yml", "vars/main.yml"):
        path = REPO / "roles" / role / relative
        variables |= (load(path) or {}) if path.is_file() else {}
    return variables


def expand(text: str, variables: dict[str, Any]) -> str:
    """``text`` with every ``{{ name ... }}`` of a role variable replaced by its value, a few levels deep."""
    pattern = re.compile(r"\{\{\s*(\w+)[^}]*\}\}")
    for _ in range(5):
        text = pattern.sub(lambda m: str(variables.get(m.group(1), m.group(0))), text)
    return text


def strings_outside_messages(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(key, string) for every string of a YAML document except task names and the text of messages."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name not in MESSAGE_KEYS:
                yield from strings_outside_messages(value, str(name))
    elif isinstance(node, list):
        for value in node:
            yield from strings_outside_messages(value, key)
    elif isinstance(node, str):
        yield key, node


def reads_the_lock(key: str, text: str) -> bool:
    """A lookup of the lock file, or a module pointed at it (stat, slurp, copy...)."""
    return bool(LOCK_LOOKUP.search(text)) or (key in PATH_KEYS and "bundle.lock" in text)


def spec_options(role: str) -> dict[str, Any]:
    specs = load(REPO / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
    options: dict[str, Any] = specs["main"].get("options") or {}
    return options


@pytest.mark.parametrize("role", ROLES)
def test_role_has_the_standard_files(role: str) -> None:
    for relative in (
        "defaults/main.yml",
        "meta/argument_specs.yml",
        "tasks/main.yml",
        "handlers/main.yml",
        "README.md",
    ):
        assert (REPO / "roles" / role / relative).is_file(), f"roles/{role}/{relative} is missing"


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_mirror_defaults(role: str) -> None:
    defaults: dict[str, Any] = load(REPO / "roles" / role / "defaults" / "main.yml") or {}
    options = spec_options(role)
    with_default = {name for name, option in options.items() if "default" in (option or {})}
    assert set(defaults) == with_default, f"roles/{role}: defaults and argument specs differ"
    for name, value in defaults.items():
        assert options[name].get("default") == value, f"roles/{role}: default of {name} differs"


@pytest.mark.parametrize("role", ROLES)
def test_role_inputs_are_prefixed_with_the_role_name(role: str) -> None:
    for name in spec_options(role):
        assert name.startswith((f"{role}_", "gpufleet_")), f"roles/{role}: {name} lacks the {role}_ prefix"


@pytest.mark.parametrize("role", ROLES)
def test_every_option_has_a_description(role: str) -> None:
    for name, option in spec_options(role).items():
        assert (option or {}).get("description"), f"roles/{role}: {name} has no description"


def test_serving_model_matches_the_vllm_service_role() -> None:
    options = spec_options("vllm_service")
    for field_name, info in ServingSpec.model_fields.items():
        name = f"vllm_service_{field_name}"
        assert name in VARIABLES
        assert name in options, f"{name} is in ServingSpec but not in the role's argument specs"
        assert options[name].get("default") == info.default, f"default of {name} differs"


def test_readme_reference_is_current() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert render(readme, REPO) == readme, "README.md is stale: run .venv/bin/python -m gpufleet.docs"
    # A clone elsewhere (CI clones to another path) must render the same README: no checkout paths in it.
    assert str(REPO) not in readme, f"README.md names this checkout's path {REPO}: help texts must not"


@pytest.mark.parametrize("name", sorted(set(gpufleet.__all__) - {"__version__"}))
def test_public_api_names_resolve_to_their_definitions(name: str) -> None:
    exported = getattr(gpufleet, name)
    assert callable(exported), f"gpufleet.{name} is {exported!r}: expected a function or a class"
    assert exported.__name__ == name, f"gpufleet.{name} resolves to {exported.__name__}"
    assert exported.__module__.startswith("gpufleet."), f"gpufleet.{name} comes from {exported.__module__}"


def test_package_version_is_the_projects() -> None:
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{gpufleet.__version__}"' in pyproject


def test_unknown_public_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'depoly'"):
        _ = gpufleet.depoly  # type: ignore[attr-defined]


@pytest.mark.parametrize("role", ROLES)
def test_main_yml_is_an_index_of_tagged_stages(role: str) -> None:
    for task in load(REPO / "roles" / role / "tasks" / "main.yml"):
        tags = tags_of(task)
        where = f"roles/{role}/tasks/main.yml: {task.get('name')!r}"
        assert role in tags, f"{where}: tags {tags} lack the role's own tag {role}"
        assert any(tag.startswith(f"{role}_") for tag in tags), (
            f"{where}: no stage tag {role}_<stage> in {tags}"
        )


@pytest.mark.parametrize("role", ROLES)
def test_includes_are_at_most_three_deep(role: str) -> None:
    for root in entry_points(role):
        if not root.is_file():
            continue
        for chain in include_chains((root,)):
            names = " -> ".join(path.name for path in chain)
            # main.yml -> converge.yml is one level: main.yml only checks whether the node is still converged
            # (gpufleet_converged) and includes converge.yml, the role's stage index, when it is not.
            gate = int(len(chain) > 1 and chain[0].name == "main.yml" and chain[1].name == "converge.yml")
            assert len(chain) - gate <= MAX_INCLUDE_DEPTH, (
                f"roles/{role}: {names} is {len(chain)} files deep; expected at most {MAX_INCLUDE_DEPTH} "
                "(main.yml -> stage file -> sub-file). Fix: include the deepest file from its stage file."
            )


@pytest.mark.parametrize("role", ROLES)
def test_every_tag_carries_the_role_name(role: str) -> None:
    for path in task_files(role):
        for task in tasks_in(load(path)):
            for tag in tags_of(task):
                where = f"{path.relative_to(REPO)}: {task.get('name')!r}"
                assert tag == role or tag.startswith(f"{role}_"), (
                    f"{where} has tag {tag!r}; expected {role} or {role}_<stage>"
                )


def template_tasks(role: str) -> Iterator[tuple[Path, dict[str, Any], dict[str, Any]]]:
    for path in task_files(role):
        for task in tasks_in(load(path)):
            for key in TEMPLATE_MODULES:
                if key in task:
                    yield path, task, task[key]


@pytest.mark.parametrize("role", ROLES)
def test_every_systemd_unit_template_is_validated(role: str) -> None:
    variables = role_variables(role)
    for path, task, args in template_tasks(role):
        src, dest = expand(str(args["src"]), variables), expand(str(args["dest"]), variables)
        is_unit = (
            "/systemd/" in dest
            or dest.endswith(UNIT_SUFFIXES)
            or src.removesuffix(".j2").endswith(UNIT_SUFFIXES)
        )
        if is_unit:
            validate = expand(str(args.get("validate", "")), variables)
            assert "systemd-analyze verify" in validate, (
                f"{path.relative_to(REPO)}: {task.get('name')!r} writes the unit {dest} without "
                "validate: (systemd-analyze verify); copy the docker role's __docker_unit_validate"
            )


def test_the_unit_check_sees_every_unit_template() -> None:
    """The rule above is not vacuous: it finds the units the roles are known to write."""
    units = {
        Path(str(args["src"])).name
        for role in ROLES
        for _, _, args in template_tasks(role)
        if str(args["src"]).removesuffix(".j2").endswith(UNIT_SUFFIXES) or "{{ item }}" in str(args["src"])
    }
    assert {"nvidia-persistenced.service.j2", "ray.service.j2", "vllm@.service.j2", "{{ item }}.j2"} <= units


@pytest.mark.parametrize("role", ROLES)
def test_only_the_lookup_plugin_reads_the_bundle_lock(role: str) -> None:
    role_dir = REPO / "roles" / role
    code = [
        path for part in ("tasks", "handlers", "vars", "defaults") for path in role_dir.glob(f"{part}/*.yml")
    ]
    for path in sorted(code):
        for key, text in strings_outside_messages(load(path)):
            assert not reads_the_lock(key, text), (
                f"{path.relative_to(REPO)} reads the bundle lock itself ({text.strip()[:120]!r}); "
                f"expected lookup('{LOCK_PLUGIN}', gpufleet_bundle_dir), the one reader of the lock"
            )
    for path in sorted(role_dir.rglob("*.py")):
        assert "bundle.lock" not in path.read_text(encoding="utf-8"), (
            f"{path.relative_to(REPO)} opens the lock"
        )


def test_the_roles_that_take_bundle_files_read_the_lock_through_the_plugin() -> None:
    users = {
        role
        for role in ROLES
        for path in task_files(role)
        if f"lookup('{LOCK_PLUGIN}'" in path.read_text(encoding="utf-8")
    }
    expected = {
        "cuda_toolkit",
        "docker",
        "gateway",
        "image_distribution",
        "model_fetch",
        "monitoring",
        "nvidia_container_toolkit",
        "nvidia_driver",
    }
    assert users == expected


def roles_a_play_applies() -> set[str]:
    """Roles named in a play's ``roles:`` or by an include/import in a playbook's own tasks."""
    names: set[str] = set()
    for path in [*REPO.glob("playbooks/*.yml"), REPO / "site.yml"]:
        for play in load(path) or []:
            roles = play.get("roles") or []
            names |= {str(role["role"] if isinstance(role, dict) else role) for role in roles}
            for section in ("pre_tasks", "tasks", "post_tasks"):
                for task in tasks_in(play.get(section)):
                    names |= {str((task.get(key) or {}).get("name")) for key in ROLE_INCLUDES if key in task}
    return names


@pytest.mark.parametrize("role", sorted(INTERNAL_ROLES))
def test_an_internal_role_is_included_only_by_roles_and_says_so(role: str) -> None:
    """Issue 34: the relay is a role of its own that image_distribution and model_fetch include with explicit
    arguments; no play applies it, and its README says it is internal."""
    assert role in ROLES, f"INTERNAL_ROLES names {role}, which roles/ does not have"
    assert role not in roles_a_play_applies(), f"a playbook applies the internal role {role}"
    readme = (REPO / "roles" / role / "README.md").read_text(encoding="utf-8")
    assert "**Internal.**" in readme.split("\n\n")[1], f"roles/{role}/README.md does not open by saying so"


def test_the_playbook_role_finder_finds_the_roles_plays_apply() -> None:
    assert {"image_distribution", "model_fetch", "vllm_service"} <= roles_a_play_applies()
