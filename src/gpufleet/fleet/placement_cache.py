"""The kept placements. The playbooks ask the lookup ``gpufleet_placement`` for the replicas again and again
(each play of serve.yml, verify.yml, status.yml, the fleet check), and Ansible asks it in a worker process of
its own each time: the import of the typed loader and the validation of the inventory cost each ask about 0.5
s of CPU: 22 of the controller's 70 busy seconds in a run of the nodes to serve stages on make demo's services
(a py-spy profile; benchmarks/results/suite-time.md). The replicas are kept as JSON under the sha256 of
everything they depend on: the inventory's reading (:func:`gpufleet.fleet.inventory_cache.cache_key`: its
files, the ansible.cfg files, the ANSIBLE_* environment, both versions) and the code that validates and places
it (every module of this package, the collection's lookups, every role's argument specs and defaults: their
paths, sizes and modification times).

Only a valid inventory's placement is kept (an invalid one is read and refused every time). What validation
reads outside the inventory (a bundle's lock, a model's config.json) is not in the key: every gpufleet command
validates the inventory with them before it runs a playbook. ``GPUFLEET_NO_CACHE=1`` turns it off.

Light on purpose: this module imports no pydantic, no schema and no ansible-core beyond its release number.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gpufleet.fleet.inventory_cache import cache_dir, cache_key, write_kept
from gpufleet.paths import project_root

PLACEMENT_FORMAT = 2  # 2: each replica's fleet_image
PACKAGE = Path(__file__).resolve().parents[1]  # src/gpufleet (or site-packages/gpufleet)


def placement_key(inventory: Path) -> str | None:
    """sha256 of everything the replicas of ``inventory`` depend on; None when its reading is not kept (a
    template, a vault, a script in it) or the cache is off."""
    reading = cache_key(inventory)
    if reading is None:
        return None
    digest = hashlib.sha256(f"placement {PLACEMENT_FORMAT}\0{reading}\0".encode())
    root = project_root()
    code = sorted(PACKAGE.rglob("*.py"))
    if root is not None:
        code += sorted(root.glob("plugins/lookup/*.py"))  # what the lookup answers is its code's too
        code += sorted(root.glob("roles/*/meta/argument_specs.yml"))
        code += sorted(root.glob("roles/*/defaults/main.yml"))
    for path in code:
        try:
            seen = path.stat()
        except OSError:
            continue
        digest.update(f"{path} {seen.st_size} {seen.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def kept_replicas(key: str) -> list[dict[str, Any]] | None:
    """The replicas kept under ``key``; None when none are (or the entry is not what :func:`keep` writes)."""
    try:
        data = json.loads((cache_dir() / "placement" / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, list) or not all(isinstance(entry, dict) for entry in data):
        return None  # the cache directory is the user's: an edited entry never answers
    return data


def keep(key: str, replicas: list[dict[str, Any]]) -> None:
    """Best effort, private (0700 directory, 0600 file, as the inventory readings)."""
    write_kept(cache_dir() / "placement", key, replicas)
