"""systemd units on a node as gpufleet's modules read them: a unit's properties, from ``systemctl show``.

Host-side code, shared through Ansible's module_utils (see the modules' imports): the standard library only,
annotations never evaluated on the node, whatever its Python. gpufleet_converged keeps its own reading of
unit states: it also runs as a standalone script on the node (fleet_record.yml installs it, the fast
re-run's check runs it with ``python -S``), where no module_utils can be imported.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


def unit_properties(unit: str, names: Iterable[str]) -> dict[str, str]:
    """The properties ``names`` of ``unit`` as ``systemctl show`` prints them, by name. A property it did not
    print is absent (systemd not running, or refusing): the caller decides what that means."""
    shown = subprocess.run(
        ["systemctl", "show", *(f"--property={name}" for name in names), unit],
        capture_output=True,
        text=True,
        check=False,
    )
    return dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
