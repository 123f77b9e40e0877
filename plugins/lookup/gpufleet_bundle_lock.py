"""Lookup plugin ``gpufleet_bundle_lock``: an offline bundle's ``bundle.lock.yml``, read and checked.

The one reader of the lock on the Ansible side: every role asks this adapter, which calls
:func:`gpufleet.bundle.read_lock`, the reader ``gpufleet bundle verify`` uses. So there is one parser, one
schema and one error for a missing or corrupt lock (its path and the fix), not a copy per role.
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

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):  # type: ignore[misc]  # ansible ships no type information: LookupBase is Any
    def run(
        self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[dict[str, Any]]:
        self.set_options(var_options=variables, direct=kwargs)
        try:
            from gpufleet.bundle import LockError, read_lock  # noqa: PLC0415 - fail with a fix, not a traceback
        except ImportError as exc:
            raise AnsibleLookupError(
                "gpufleet_bundle_lock: the gpufleet Python package is not importable by this "
                f"ansible-playbook's Python ({exc}). Fix: install it into the same environment "
                "(pip install -e . in the gpufleet checkout)."
            ) from None
        locks: list[dict[str, Any]] = []
        for term in terms:
            if not str(term).strip():
                raise AnsibleLookupError(
                    "gpufleet_bundle_lock: expected a bundle directory; found an empty path. "
                    "Fix: set gpufleet_bundle_dir to a directory built by `gpufleet bundle build`."
                )
            try:
                lock = read_lock(Path(str(term)))
            except LockError as exc:  # its message names the lock file and the fix
                raise AnsibleLookupError(str(exc)) from None
            locks.append(lock.model_dump(mode="json"))
        return locks
