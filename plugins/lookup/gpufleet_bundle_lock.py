"""Lookup plugin ``gpufleet_bundle_lock``: an offline bundle's ``bundle.lock.yml``, read and checked.

The one reader of the lock on the Ansible side: every role asks this adapter, which calls
:func:`gpufleet.bundle.read_lock`, the reader ``gpufleet bundle verify`` uses. So there is one parser, one
schema and one error for a missing or corrupt lock (its path and the fix), not a copy per role.

Ansible runs each task in a fresh worker process, and the roles template variables that use this lookup in
many tasks: importing the reader (the bundle package, pydantic) cost each of them about 0.4 s of CPU, a sixth
of ansible-playbook's CPU in a profile of a lab deploy. So what the reader returned is kept as JSON in the
user's cache (``$XDG_CACHE_HOME/gpufleet/locks/``), keyed by the lock file's identity (path, device, inode,
size, mtime_ns, ctime_ns: a rewritten or replaced lock has another) and the reader's (its source files'):
a later task reads that JSON and imports nothing of gpufleet.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_bundle_lock
author: gpufleet maintainers (@gpufleet)
short_description: Read an offline bundle's lock file (bundle.lock.yml)
description:
  - Reads C(<bundle>/bundle.lock.yml) on the control node with gpufleet's own reader
    (C(gpufleet.bundle.read_lock), the one C(gpufleet bundle verify) uses), checks it against the lock's
    schema and returns it as a dictionary.
  - A missing or unreadable lock fails the task with the lock's path and the fix.
options:
  _terms:
    description: Bundle directories on the control node, usually C(gpufleet_bundle_dir).
    type: list
    elements: path
    required: true
notes:
  - Runs on the control node. The gpufleet Python package must be importable by the Python that runs
    ansible-playbook (it is in gpufleet's virtual environment).
  - With one directory C(lookup) returns that bundle's lock; C(query) always returns a list of locks.
  - What it read is kept as JSON under C($XDG_CACHE_HOME/gpufleet/locks/) (C(~/.cache) without it), keyed by
    the lock file's identity (path, device, inode, size, modification and change times) and the reader's, so
    a later task reads that instead of importing the reader again; a rewritten lock is read again.
"""

EXAMPLES = r"""
- name: Take the tarball's sha256 from the bundle lock
  ansible.builtin.set_fact:
    __docker_lock_sha256: >-
      {{ lookup('gpufleet_bundle_lock', gpufleet_bundle_dir).files
         | selectattr('path', 'equalto', 'docker/docker-27.5.1.tgz') | map(attribute='sha256') | first }}

- name: Name the images the bundle holds
  ansible.builtin.debug:
    msg: "{{ lookup('gpufleet_bundle_lock', gpufleet_bundle_dir).images | map(attribute='name') | list }}"
"""

RETURN = r"""
_raw:
  description: One lock per bundle directory.
  type: list
  elements: dict
  contains:
    schema_version:
      description: Version of the lock format.
      type: int
      sample: 1
    manifest:
      description: The manifest the bundle was built from.
      type: str
    files:
      description: Every file of the bundle, C(path) relative to the bundle directory.
      type: list
      elements: dict
      contains:
        path: {description: Path relative to the bundle directory., type: str}
        size: {description: Size in bytes., type: int}
        sha256: {description: "sha256 of the file, 64 lowercase hex digits.", type: str}
        version: {description: Version of the artifact the file belongs to., type: str}
        source: {description: Where the build fetched it from., type: str}
    images:
      description: Every container image, with the archive that holds it.
      type: list
      elements: dict
      contains:
        name: {description: Image name., type: str}
        tag: {description: Image tag., type: str}
        id: {description: "Image ID, C(sha256:...)", type: str}
        path: {description: "The archive, relative to the bundle directory.", type: str}
        compression: {description: "C(none), C(gzip) or C(zstd).", type: str}
    models:
      description: Every model repository, cloned at a pinned revision.
      type: list
      elements: dict
      contains:
        repo: {description: "Repository id, C(<org>/<name>).", type: str}
        revision: {description: The commit., type: str}
        path: {description: "The clone, relative to the bundle directory.", type: str}
        url: {description: Where it was cloned from., type: str}
"""

import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

LOCK_NAME = "bundle.lock.yml"  # gpufleet.bundle.lock.LOCK_NAME (not imported: see the module's docstring)


def _cache_file(bundle: Path) -> Path | None:
    """Where the lock of ``bundle`` read by this reader is kept; None when either cannot be identified."""
    spec = importlib.util.find_spec("gpufleet")  # imports nothing for a top-level package
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        package = Path(spec.submodule_search_locations[0], "bundle")
        files = [(bundle / LOCK_NAME).resolve(), package / "lock.py", package / "manifest.py"]  # data, schema
        identity = [
            [str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
            for path, info in ((path, path.stat()) for path in files)
        ]
    except OSError:
        return None  # no lock there: the reader says so, with the fix
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base, "gpufleet", "locks", f"{key}.json")


def _read(bundle: Path) -> dict[str, Any]:
    cache = _cache_file(bundle)
    if cache is not None:
        try:
            cached: dict[str, Any] = json.loads(cache.read_text(encoding="utf-8"))
            return cached
        except (OSError, ValueError):
            pass  # not kept yet, or unreadable: read the lock
    try:
        from gpufleet.bundle.lock import LockError, read_lock  # noqa: PLC0415 - fail with a fix, not a traceback
    except ImportError as exc:
        raise AnsibleLookupError(
            "gpufleet_bundle_lock: the gpufleet Python package is not importable by this "
            f"ansible-playbook's Python ({exc}). Fix: install it into the same environment "
            "(pip install -e . in the gpufleet checkout)."
        ) from None
    try:
        lock: dict[str, Any] = read_lock(bundle).model_dump(mode="json")
    except LockError as exc:  # its message names the lock file and the fix
        raise AnsibleLookupError(str(exc)) from None
    if cache is not None:
        try:  # written whole, then renamed: a reader never sees half of it
            cache.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, encoding="utf-8") as out:
                json.dump(lock, out)
            os.replace(out.name, cache)
        except OSError:
            pass  # a read-only cache only costs the next task this read again
    return lock


class LookupModule(LookupBase):  # type: ignore[misc]  # ansible ships no type information: LookupBase is Any
    def run(
        self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[dict[str, Any]]:
        self.set_options(var_options=variables, direct=kwargs)
        locks: list[dict[str, Any]] = []
        for term in terms:
            if not str(term).strip():
                raise AnsibleLookupError(
                    "gpufleet_bundle_lock: expected a bundle directory; found an empty path. "
                    "Fix: set gpufleet_bundle_dir to a directory built by `gpufleet bundle build`."
                )
            locks.append(_read(Path(str(term))))
        return locks
