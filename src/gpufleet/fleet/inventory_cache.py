"""The kept readings of inventories. ansible-core's reading costs about 0.5 s of CPU (mostly its import),
and validate, plan and deploy read the same inventory again and again, so
:func:`gpufleet.fleet.inventory.read_inventory` keeps each reading under the sha256 of everything it depends
on (:func:`cache_key`), in a private directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.fleet.raw import RawHost, RawInventory
from gpufleet.fleet.yaml_guard import MAX_FILE_BYTES, read_capped
from gpufleet.problems import Problem

# What the cache of read_inventory's result depends on, besides the inventory's own files.
CACHE_FORMAT = 3  # 2: readings before it could hold a persistent fact cache's facts; 3: or a run's -e values
ANSIBLE_CONFIGS = ("ansible.cfg", "~/.ansible.cfg", "/etc/ansible/ansible.cfg")
# Files holding these are read through Ansible every time: a template may read the environment or other
# files (lookup), a vaulted value needs a secret, a plugin or a script asks something outside the files.
UNCACHEABLE = (b"{{", b"{%", b"{#", b"$ANSIBLE_VAULT", b"!vault", b"plugin:")


def cache_dir() -> Path:
    """``$GPUFLEET_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpufleet``, else ``~/.cache/gpufleet``."""
    if explicit := os.environ.get("GPUFLEET_CACHE_DIR"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpufleet"


def scan(path: Path) -> dict[Path, bytes]:
    """Every file Ansible may read for ``path``, with its bytes, each read once (b"" for one that cannot be
    read; at most ``yaml_guard.MAX_FILE_BYTES + 1`` bytes of a larger one, refused before Ansible reads it).

    A directory's whole tree, whatever the extension (which ones Ansible skips is its configuration's
    choice: gpufleet's ansible.cfg reads ``hosts.ini``, Ansible's default does not); beside a hosts file, its
    group_vars and host_vars, the only vars directories Ansible reads for an inventory without a playbook.
    Symlinked directories are followed, as Ansible follows them; hidden files are left out, as Ansible
    leaves them out."""
    files: dict[Path, bytes] = {}
    for file in (file for root in roots(path) for file in files_under(root)):
        try:
            files[file] = read_capped(file)
        except OSError:
            files[file] = b""
    return files


def roots(path: Path) -> list[Path]:
    """The inventory directory; or the hosts file with the group_vars and host_vars beside it."""
    return [path] if path.is_dir() else [path, path.parent / "group_vars", path.parent / "host_vars"]


def files_under(root: Path) -> list[Path]:
    """``root`` itself when it is a file; else every file under it that is not hidden, sorted, following
    symlinked directories (``Path.rglob`` does not), each real directory once (a symlink loop ends)."""
    if not root.is_dir():
        return [root] if root.is_file() else []
    found: list[Path] = []
    seen: set[Path] = set()
    folders = [root]
    while folders:  # a stack, not recursion: a tree may be deeper than Python's recursion limit
        folder = folders.pop()
        real = folder.resolve()
        if real in seen:
            continue
        seen.add(real)
        try:
            children = sorted(child for child in folder.iterdir() if not child.name.startswith("."))
        except OSError:
            continue
        folders += [child for child in children if child.is_dir()]
        found += [child for child in children if child.is_file()]
    return sorted(found)


def cache_key(path: Path, files: Mapping[Path, bytes] | None = None) -> str | None:
    """sha256 of everything Ansible's reading of ``path`` depends on; None when it is not only files.

    Reading an inventory through ansible-core costs about 0.5 s of CPU, mostly its import; validate, plan
    and deploy read the same inventory again and again, so the result is kept, keyed by the content of
    every file Ansible reads (hosts files, group_vars, host_vars, beside a hosts file too), the ansible.cfg
    files it would read, the ANSIBLE_* environment and both versions. ``GPUFLEET_NO_CACHE=1`` turns it off.
    """
    if os.environ.get("GPUFLEET_NO_CACHE"):
        return None
    from ansible.release import __version__ as ansible_version  # noqa: PLC0415  (not ansible.constants)

    from gpufleet._version import __version__  # noqa: PLC0415

    digest = hashlib.sha256(f"{CACHE_FORMAT}\0{__version__}\0{ansible_version}\0{path}\0".encode())
    for name, value in sorted(os.environ.items()):
        if name.startswith("ANSIBLE_"):
            digest.update(f"env {name}={value}\0".encode())
    for file, data in (scan(path) if files is None else files).items():
        if os.access(file, os.X_OK) or any(mark in data for mark in UNCACHEABLE):
            return None
        if len(data) > MAX_FILE_BYTES:
            return None  # only its start was read; yaml_guard refuses it
        digest.update(f"file {file} {len(data)}\0".encode() + data)
    configs = [Path(os.environ.get("ANSIBLE_CONFIG", "ansible.cfg"))] + [
        Path(name).expanduser() for name in ANSIBLE_CONFIGS
    ]
    for config in configs:
        try:
            data = config.read_bytes()
        except OSError:
            data = b""
        digest.update(f"file {config} {len(data)}\0".encode() + data)
    return digest.hexdigest()


def cache_read(key: str, path: Path) -> RawInventory | None:
    try:
        data = json.loads((cache_dir() / "inventory" / f"{key}.json").read_text(encoding="utf-8"))
        return _entry(data, path)
    except (OSError, ValueError, TypeError):
        return None  # absent, or not what cache_write writes: read through Ansible and write it again


PROBLEM_FIELDS = frozenset(field.name for field in dataclasses.fields(Problem))


def _entry(data: Any, path: Path) -> RawInventory:
    """The reading a cache entry holds, checked to be of the shape :func:`cache_write` writes (TypeError
    otherwise): the cache directory is the user's, and a half-written or edited entry must never answer."""
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("hosts", "problems")):
        raise TypeError("not a cache entry")
    hosts = []
    for host in data["hosts"]:
        if not (
            isinstance(host, dict)
            and isinstance(host.get("name"), str)
            and isinstance(host.get("groups"), list)
            and all(isinstance(group, str) for group in host["groups"])
            and isinstance(host.get("variables"), dict)
        ):
            raise TypeError("not a host of a cache entry")
        hosts.append(RawHost(host["name"], frozenset(host["groups"]), host["variables"]))
    problems = []
    for problem in data["problems"]:
        if not (
            isinstance(problem, dict)
            and set(problem) == PROBLEM_FIELDS
            and all(isinstance(value, str) for value in problem.values())
        ):
            raise TypeError("not a problem of a cache entry")
        problems.append(Problem(**problem))
    return RawInventory(path=path, hosts=tuple(hosts), problems=tuple(problems))


def cache_write(key: str, inventory: RawInventory) -> None:
    """Best effort, private (0700 directory, 0600 file: the values may include the user's secrets)."""
    data = {
        "hosts": [
            {"name": host.name, "groups": sorted(host.groups), "variables": host.variables}
            for host in inventory.hosts
        ],
        "problems": [dataclasses.asdict(problem) for problem in inventory.problems],
    }
    write_kept(cache_dir() / "inventory", key, data)


def write_kept(folder: Path, key: str, data: Any) -> None:
    """``data`` as JSON in ``folder/KEY.json``, written whole or not at all: best effort, private (0700
    directory, 0600 file)."""
    try:
        text = json.dumps(data)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")  # created 0600
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, folder / f"{key}.json")
    except (OSError, TypeError, ValueError):
        return  # a read-only home or a value JSON cannot hold: no cache, same result
