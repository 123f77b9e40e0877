"""Where gpufleet's own files (site.yml, playbooks/, roles/) live: a checkout, or the installed collection."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

# Inside the wheel (setup.py copies it there): <site-packages>/gpufleet/_data/ansible_collections/...
INSTALLED_COLLECTION = ("_data", "ansible_collections", "gpufleet", "gpufleet")


def installed_collection() -> Path:
    """The collection the wheel carries (it may not exist in an editable install)."""
    return Path(str(resources.files("gpufleet").joinpath(*INSTALLED_COLLECTION)))


def project_root() -> Path | None:
    """The directory holding site.yml and roles/.

    ``$GPUFLEET_HOME`` (a checkout, as an override), else the checkout this package runs from (an
    editable install), else the collection installed with the package.
    """
    candidates = []
    if home := os.environ.get("GPUFLEET_HOME"):
        candidates.append(Path(home))
    candidates += [Path(__file__).resolve().parents[2], installed_collection()]
    for candidate in candidates:
        if (candidate / "site.yml").is_file() and (candidate / "roles").is_dir():
            return candidate
    return None
