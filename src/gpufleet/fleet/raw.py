"""An inventory as Ansible resolved it: its hosts, their groups and the variables the user set (templates
rendered), and the problems seen in its files. :mod:`gpufleet.fleet.inventory` reads it;
:mod:`gpufleet.fleet.inventory_cache` keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.problems import Problem


@dataclass(frozen=True)
class RawHost:
    """One host as Ansible resolved it: its groups and the variables the user set (templates rendered)."""

    name: str
    groups: frozenset[str]
    variables: Mapping[str, Any]


@dataclass(frozen=True)
class RawInventory:
    path: Path
    hosts: tuple[RawHost, ...]
    problems: tuple[Problem, ...] = field(default=())

    def members(self, group: str) -> list[RawHost]:
        return [host for host in self.hosts if group in host.groups]
