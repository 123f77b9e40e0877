"""Lookup plugin ``gpufleet_sha256``: a control-node file's sha256, from the bundle check when unchanged.

The preflight stage verifies the whole bundle (action ``gpufleet_bundle_verify``: every byte on the first run,
then only files whose identity changed). The image_distribution role checks each archive again before it
sends it; this lookup gives it the sha256 the bundle check matched when the file is still the very file it
read (device, inode, size, mtime, ctime: :func:`gpufleet.bundle.verified.file_sha256`), and hashes it
otherwise. On the lab's 2.7 GB image archive that is the 3-4 s of hashing it took on every cold deploy.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_sha256
author: gpufleet maintainers (@gpufleet)
short_description: The sha256 of files on the control node, from the bundle check's cache when unchanged
description:
  - Returns the sha256 (hex) of each file on the control node, or an empty string for a missing or
    unreadable file.
  - With I(bundle), a file inside that bundle whose identity (device, inode, size, mtime, ctime) is the one
    the last bundle check (preflight's C(gpufleet_bundle_verify)) matched is not read again; any change to
    the file, even one that keeps its size and mtime, changes its ctime and makes it read in full.
options:
  _terms:
    description: Files on the control node.
    type: list
    elements: path
    required: true
  bundle:
    description: The bundle directory the files belong to (C(gpufleet_bundle_dir)); empty to always hash.
    type: path
    default: ""
notes:
  - Runs on the control node. The gpufleet Python package must be importable by the Python that runs
    ansible-playbook.
"""

EXAMPLES = r"""
- name: Check an image archive against the sha256 its bundle lock pins
  ansible.builtin.assert:
    that: lookup('gpufleet_sha256', archive, bundle=gpufleet_bundle_dir) == pinned_sha256
"""

RETURN = r"""
_raw:
  description: One sha256 (64 hex digits) per file; an empty string where the file cannot be read.
  type: list
  elements: str
"""

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):  # type: ignore[misc]
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
        self.set_options(var_options=variables, direct=kwargs)
        try:
            from gpufleet.bundle.verified import file_sha256  # noqa: PLC0415
        except ImportError as exc:
            raise AnsibleError(
                "the gpufleet Python package is not importable by this ansible-playbook's Python; install it "
                "into the same environment (pip install -e . in the gpufleet checkout)"
            ) from exc
        bundle = str(self.get_option("bundle") or "")
        root = Path(bundle) if bundle else None
        files = [item for term in terms for item in (term if isinstance(term, list) else [term])]
        return [file_sha256(Path(str(path)), root=root) for path in files]
