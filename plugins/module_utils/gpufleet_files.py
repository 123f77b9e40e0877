"""Files on a node as gpufleet's modules read them: a file's sha256, and the model directory's marker.

The marker (``.gpufleet-model.json`` in the model directory) says what the directory holds: repo, revision
and every file with its size and sha256. gpufleet_model_check writes it only after every file matched, and
gpufleet_revision reads its revision for the rollback.

Host-side code, shared through Ansible's module_utils (see the modules' imports): the standard library only,
annotations never evaluated on the node, whatever its Python.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

MODEL_MARKER = ".gpufleet-model.json"
CHUNK = 1 << 20  # model weights are gigabytes: read them a MiB at a time


def sha256(path: str) -> str:
    """The sha256 of a file's bytes, as 64 lowercase hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_model_marker(model_dir: str) -> dict[str, Any] | None:
    """The marker of ``model_dir``; None when there is none or it is not JSON (a model not to be trusted)."""
    try:
        with open(os.path.join(model_dir, MODEL_MARKER)) as src:
            marker: dict[str, Any] = json.load(src)
            return marker
    except (OSError, ValueError):
        return None


def write_model_marker(model_dir: str, marker: Mapping[str, Any]) -> None:
    """Replace the marker of ``model_dir`` at once (a temporary file renamed over it): a reader finds the
    old marker or the new one, never a part."""
    path = os.path.join(model_dir, MODEL_MARKER)
    with open(path + ".tmp", "w") as out:
        json.dump(marker, out, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
