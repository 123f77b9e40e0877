"""Read an Ansible inventory with ansible-core's own InventoryManager and VariableManager.

Ansible's precedence rules decide every value (inventory files, group_vars, host_vars, children); this
module only renders templates, turns Ansible's tagged values into plain Python, and reports problems it
can see in the files themselves (duplicate keys, which Ansible merely warns about and then drops).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpufleet.fleet.inventory_cache import cache_key, cache_read, cache_write, files_under, roots, scan
from gpufleet.fleet.raw import RawHost, RawInventory
from gpufleet.fleet.retired import PREFIX as RETIRED_PREFIX
from gpufleet.fleet.retired import variable_problem as retired_variable
from gpufleet.fleet.yaml_guard import hazard
from gpufleet.paths import project_root
from gpufleet.problems import InventoryError, Problem

# Variables Ansible adds to every host; never the user's.
MAGIC_VARIABLES = frozenset(
    {
        "group_names",
        "groups",
        "inventory_dir",
        "inventory_file",
        "inventory_hostname",
        "inventory_hostname_short",
        "playbook_dir",
        "omit",
        "hostvars",
        "role_names",
        "environment",
    }
)
INVENTORY_SUFFIXES = (".yml", ".yaml", ".json", "")


def read_inventory(path: Path) -> RawInventory:
    """Load an inventory file or directory; raises InventoryError when it cannot be read at all."""
    if not path.exists():
        raise InventoryError(
            [
                Problem(
                    str(path),
                    "-i",
                    "no such file or directory",
                    "an inventory file or directory",
                    "pass the path of your inventory, e.g. -i inventories/prod",
                )
            ]
        )
    files = scan(path)  # one reading of every file: the cache key and the duplicate-key check share it
    key = cache_key(path, files)
    if key is not None and (cached := cache_read(key, path)) is not None:
        return cached
    duplicates = list(_duplicate_keys(path, files))
    if unreadable := [problem for problem in duplicates if problem.variable == "-i"]:
        raise InventoryError(unreadable)  # Ansible would stop on them with a traceback
    if path.is_dir() and not any(_is_hosts_source(child) for child in path.iterdir()):
        raise InventoryError(
            [
                Problem(
                    str(path),
                    "-i",
                    "no hosts file in the directory (only "
                    + ", ".join(sorted(c.name for c in path.iterdir()))
                    + ")",
                    "a hosts file (e.g. hosts.yml) beside group_vars/",
                    f"add {path}/hosts.yml (`gpufleet init` writes one), or pass the hosts file itself",
                )
            ]
        )
    hosts, problems = _load_with_ansible(path)
    problems += _stray_host_vars(path, {host.name for host in hosts})
    inventory = RawInventory(path=path, hosts=tuple(hosts), problems=tuple(duplicates + problems))
    if key is not None:
        cache_write(key, inventory)
    return inventory


def _skip_secrets() -> None:
    """Add SECRET_EXTENSIONS to the pattern of names InventoryManager skips in a directory, whatever the
    ansible.cfg (ansible.inventory.manager compiles IGNORED from INVENTORY_IGNORE_EXTS when imported)."""
    import re  # noqa: PLC0415

    from ansible.inventory import manager  # noqa: PLC0415

    secrets = [re.escape(ext).encode() + b"$" for ext in SECRET_EXTENSIONS]
    if not all(manager.IGNORED.search(b"x" + ext.encode()) for ext in SECRET_EXTENSIONS):
        manager.IGNORED = re.compile(manager.IGNORED.pattern + b"|" + b"|".join(secrets))


class _NoFacts:
    """A fact cache that holds nothing (VariableManager asks it with ``get`` and expects KeyError)."""

    def get(self, host: str) -> dict[str, Any]:
        raise KeyError(host)


def _load_with_ansible(path: Path) -> tuple[list[RawHost], list[Problem]]:
    # Imported here: ansible's import reads its configuration, which only the commands that need it pay for.
    import ansible.constants as ansible_constants  # noqa: PLC0415
    from ansible.errors import AnsibleError  # noqa: PLC0415
    from ansible.inventory.manager import InventoryManager  # noqa: PLC0415
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415
    from ansible.vars.manager import VariableManager  # noqa: PLC0415

    # An unparsable source is an error here, not Ansible's warning and an empty inventory; duplicate keys
    # are reported by _duplicate_keys with their file and line instead of Ansible's warning.
    ansible_constants.INVENTORY_ANY_UNPARSED_IS_FAILED = True
    ansible_constants.DUPLICATE_YAML_DICT_KEY = "ignore"
    _skip_secrets()
    loader = DataLoader()
    try:
        manager = InventoryManager(loader=loader, sources=[str(path)])
        variables = VariableManager(loader=loader, inventory=manager)
        # The inventory alone: a persistent fact cache (ansible-runner's jsonfile, or the user's ansible.cfg)
        # holds the facts of this run's earlier tasks and of earlier runs, which are not inventory variables.
        variables._fact_cache = _NoFacts()
        # And the inventory alone: inside ansible-playbook (the placement lookup, the validate action) Ansible
        # adds the run's -e values, which are no inventory variables (the runner's own, such as status's
        # gpufleet_status_promql, read as unknown ones) and which the cache, keyed by files, cannot see.
        variables._extra_vars = {}
    except AnsibleError as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise InventoryError(
            [
                Problem(
                    str(path),
                    "-i",
                    first_line,
                    "an Ansible inventory (YAML or INI)",
                    "fix the syntax; `ansible-inventory -i PATH --list` shows Ansible's own view",
                )
            ]
        ) from None
    hosts: list[RawHost] = []
    problems: list[Problem] = []
    owned = own_prefixes()
    for host in manager.get_hosts():
        try:
            resolved = variables.get_vars(host=host, include_hostvars=False)
        except AnsibleError as error:  # e.g. group_vars holding a list: "failed to combine variables"
            raise InventoryError(
                [
                    Problem(
                        f"host {host.name}",
                        "group_vars / host_vars",
                        str(error).splitlines()[0],
                        "a YAML mapping of variable names to values in every vars file",
                        "make each group_vars/host_vars file a mapping (`name: value` lines), not a list",
                    )
                ]
            ) from None
        rendered, host_problems = _render(host.name, resolved, loader, owned)
        problems += host_problems
        groups = frozenset(group.name for group in host.get_groups())
        hosts.append(RawHost(host.name, groups, rendered))
    return hosts, problems


def _render(
    host: str, resolved: Mapping[str, Any], loader: Any, owned: tuple[str, ...]
) -> tuple[dict[str, Any], list[Problem]]:
    from ansible.errors import AnsibleError  # noqa: PLC0415
    from ansible.template import Templar  # noqa: PLC0415

    templar = Templar(loader=loader, variables=dict(resolved))
    rendered: dict[str, Any] = {}
    problems: list[Problem] = []
    for name, value in resolved.items():
        if name in MAGIC_VARIABLES or name in {"ansible_facts", "ansible_version", "ansible_config_file"}:
            continue
        if name == "ansible_playbook_python":
            continue
        try:
            rendered[name] = plain(templar.template(value))
        except (AnsibleError, ReferenceError) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            if isinstance(error, ReferenceError) or "vault" in message.lower():
                # ansible-core reads vault values lazily: without a vault secret they cannot be read at all.
                if name.startswith(RETIRED_PREFIX):  # the name alone says what replaces it
                    problems.append(retired_variable(host, name))
                elif name.startswith(owned):
                    problems.append(
                        Problem(
                            f"host {host}",
                            name,
                            "a vault-encrypted value",
                            "a plain value (gpufleet validates without vault passwords)",
                            "keep gpufleet's own variables unencrypted; vault only secrets it does not read",
                        )
                    )
                continue
            problems.append(
                Problem(
                    f"host {host}",
                    name,
                    repr(plain(value)),
                    "a template that renders",
                    f"fix the template ({message})",
                )
            )
    return rendered, problems


def own_prefixes(root: Path | None = None) -> tuple[str, ...]:
    """The variables gpufleet reads: ``gpufleet_``, each role's namespace and ``ansible_host``; others (a
    vaulted become password, say) are left to Ansible.

    A role's namespace is ``<role>_`` for every role with argument specs, the roles validation reads its
    variable names from (``validate.role_variables``): a new role's variables are gpufleet's the day it lands.
    A hand-kept list here once missed ``monitoring_``, and a vaulted ``monitoring_*`` value was skipped
    without a word.
    """
    root = root or project_root()
    specs = sorted(root.glob("roles/*/meta/argument_specs.yml")) if root else []
    return ("gpufleet_", *(f"{spec.parent.parent.name}_" for spec in specs), "ansible_host")


HOSTS_SUFFIXES = (".yml", ".yaml", ".ini", ".cfg", "")


def _is_hosts_source(child: Path) -> bool:
    """What Ansible reads as an inventory source in a directory (not group_vars/host_vars, not dotfiles)."""
    if child.name in ("group_vars", "host_vars") or child.name.startswith("."):
        return False
    return (child.is_file() and child.suffix in HOSTS_SUFFIXES) or child.is_dir()


def _stray_host_vars(path: Path, hosts: set[str]) -> list[Problem]:
    """host_vars for a host the inventory does not have: Ansible ignores them without a word."""
    folder = (path if path.is_dir() else path.parent) / "host_vars"
    if not folder.is_dir():
        return []
    names = {child.name.split(".")[0] if child.is_file() else child.name for child in folder.iterdir()}
    return [
        Problem(
            str(folder / name),
            "host_vars",
            f"variables for host {name!r}, which no group of the inventory has",
            f"host_vars only for the inventory's hosts ({', '.join(sorted(hosts))})",
            "rename the file after the host (a typo?), or add the host to the inventory",
        )
        for name in sorted(names - hosts)
    ]


def plain(value: Any) -> Any:
    """Ansible 2.19 tags values with their origin (str/int subclasses); strip to plain Python types."""
    if isinstance(value, bool) or value is None:
        return value
    for scalar in (str, int, float):
        if isinstance(value, scalar):
            return scalar(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Iterable):
        return [plain(v) for v in value]
    return value


class _DuplicateKeyLoader(yaml.SafeLoader):
    """A YAML loader that records duplicate mapping keys instead of silently keeping the last one."""

    duplicates: list[tuple[str, int]]


def _construct_mapping(loader: _DuplicateKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str) and key in seen:
            loader.duplicates.append((key, key_node.start_mark.line + 1))
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_DuplicateKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# Ansible's YAML uses tags SafeLoader does not know (!vault, !unsafe); treat them as plain scalars here.
_DuplicateKeyLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _inventory_files(path: Path) -> Iterator[Path]:
    for root in roots(path):
        for candidate in files_under(root):
            if candidate == path or candidate.suffix in (".yml", ".yaml"):
                yield candidate


def _syntax_error(file: Path, error: yaml.MarkedYAMLError) -> Problem:
    mark = error.problem_mark or error.context_mark
    where = f"{file}:{mark.line + 1}" if mark is not None else str(file)
    said = " ".join(part for part in (error.context, error.problem) if part)
    return Problem(
        where,
        "-i",
        f"YAML it cannot read ({said})",
        "YAML: `name: value` lines, nested values indented with spaces (no tabs), quotes closed",
        "correct the line (a tab, an unclosed quote or bracket, a missing ': '); `yamllint FILE` shows more",
    )


def _decode(file: Path, data: bytes) -> tuple[str | None, Problem | None]:
    """The file's text; or the problem Ansible would choke on (not UTF-8, binary content)."""
    fix = "save it as UTF-8 text, or move non-inventory files out of the inventory directory"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, Problem(
            str(file), "-i", f"bytes that are not UTF-8 at offset {error.start}", "UTF-8 text", fix
        )
    try:
        yaml.reader.Reader(text)
    except yaml.reader.ReaderError as error:
        return None, Problem(
            str(file), "-i", f"character {error.character!r} at offset {error.position}", "text", fix
        )
    return text, None


# Secrets gpufleet writes beside an inventory (the API key, Grafana's admin password): never inventory sources
# (Ansible's ini plugin would read each as a host named after the secret). gpufleet's ansible.cfg lists them
# in ignore_extensions; _skip_secrets adds them to InventoryManager's pattern whatever the ansible.cfg.
SECRET_EXTENSIONS = (".apikey", ".grafana-password")
# Extensions Ansible skips in an inventory directory with gpufleet's ansible.cfg (ignore_extensions: Ansible's
# INVENTORY_IGNORE_EXTS less .ini, plus the secrets); every other file it reads. The cache key does not rely
# on this list (another ansible.cfg may differ): it covers every file (inventory_cache.scan).
ANSIBLE_SKIPS = (
    *SECRET_EXTENSIONS,
    ".pyc",
    ".pyo",
    ".swp",
    ".bak",
    "~",
    ".rpm",
    ".md",
    ".txt",
    ".rst",
    ".orig",
    ".cfg",
    ".retry",
)


def _read_by_ansible(path: Path) -> Iterator[Path]:
    for root in roots(path):
        for candidate in files_under(root):
            if candidate == path or not candidate.name.endswith(ANSIBLE_SKIPS):
                yield candidate


def _duplicate_keys(path: Path, files: Mapping[Path, bytes] | None = None) -> Iterator[Problem]:
    """Unreadable files and YAML hazards (as -i problems: read_inventory stops before Ansible reads them),
    YAML files that are not mappings (-i too: Ansible stops on them with "failed to combine variables",
    naming no file), and keys defined twice; from ``files`` (``inventory_cache.scan``, read here when not
    given), which holds every file under ``path``."""
    files = scan(path) if files is None else files
    texts: dict[Path, str] = {}
    for file in _read_by_ansible(path):
        data = files.get(file, b"")
        problem = hazard(file, data)  # an alias bomb, deep nesting or a huge file: before any YAML loader
        text = None
        if problem is None:
            text, problem = _decode(file, data)
        if problem is not None:
            yield problem
        elif text is not None:
            texts[file] = text
    for file in _inventory_files(path):
        if file not in texts:
            continue
        loader = _DuplicateKeyLoader(texts[file])
        loader.duplicates = []
        try:
            data = loader.get_single_data()
        except yaml.MarkedYAMLError as error:
            # A syntax error in a vars file reaches Ansible's message without the file's name: say it here
            # (a hosts file without .yml may be INI, and an unknown tag Ansible's own: left to Ansible).
            if file.suffix in (".yml", ".yaml") and not isinstance(error, yaml.constructor.ConstructorError):
                yield _syntax_error(file, error)
            continue
        finally:
            loader.dispose()
        if data is not None and not isinstance(data, dict):
            kind = "list" if isinstance(data, list) else f"{type(data).__name__} scalar"
            yield Problem(
                str(file),
                "-i",
                f"a YAML {kind} at the top level",
                "a YAML mapping (`name: value` lines: hosts and groups in a hosts file, variables in "
                "group_vars/host_vars)",
                "write the file as a mapping, not a list or a bare value",
            )
            continue
        for key, line in loader.duplicates:
            yield Problem(
                f"{file}:{line}",
                key,
                "defined twice in one mapping",
                "each host or variable once",
                "remove or rename one of them (Ansible keeps only the last and says nothing more)",
            )
