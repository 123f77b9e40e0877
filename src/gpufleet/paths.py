"""Where gpufleet's own files (site.yml, playbooks/, roles/) live."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path | None:
    """The directory holding site.yml and roles/: ``$GPUFLEET_HOME``, else this package's checkout."""
    candidates = []
    if home := os.environ.get("GPUFLEET_HOME"):
        candidates.append(Path(home))
    candidates.append(Path(__file__).resolve().parents[2])
    for candidate in candidates:
        if (candidate / "site.yml").is_file() and (candidate / "roles").is_dir():
            return candidate
    return None
