"""What a running lab is made of, kept on disk so `down` and the next `up` can clean up after a crash."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gpufleet.lab.host import HostSpec
from gpufleet.lab.system import LabError, state_root

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


class HostState(BaseModel):
    """One host as booted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hostname: str
    ip: str
    machine: str
    netns: str
    workdir: Path
    cgroups: tuple[str, ...]

    def spec(self) -> HostSpec:
        return HostSpec(self.hostname, self.ip, self.machine, self.netns, self.workdir, self.cgroups)


class LabState(BaseModel):
    """One lab: its network slot, hosts, root file system and the inventory written for it.

    Running labs' state files must keep loading after an upgrade: add fields with defaults only.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    index: int  # 10.231.<index>.0/24, bridge gflbr<index>
    offline: bool
    suite: str
    lowerdir: str  # overlay lower dirs of the root file system, top first
    key: Path
    inventory: Path
    hosts: list[HostState]


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise LabError(
            f"lab: --name: found {name!r}; expected 1-40 characters of a-z, 0-9, '-', '_', "
            "starting with a letter or digit. Fix: pick a name like 'pytest' or 'molecule-docker'."
        )
    return name


def lab_dir(name: str) -> Path:
    return state_root() / check_name(name)


def state_file(name: str) -> Path:
    return lab_dir(name) / "lab.json"


def load(name: str) -> LabState | None:
    """The lab's state, or None when no lab of that name was started (or it was torn down)."""
    path = state_file(name)
    if not path.exists():
        return None
    return LabState.model_validate_json(path.read_text())


def save(state: LabState) -> None:
    path = state_file(state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(path)


def taken_indexes() -> set[int]:
    """Subnet indexes reserved by every lab with a state file, running or crashed."""
    taken = set()
    root = state_root()
    for path in root.glob("*/lab.json") if root.is_dir() else []:
        try:
            taken.add(LabState.model_validate_json(path.read_text()).index)
        except ValueError:
            continue  # a half-written state file of a lab being created; its owner holds the lock
    return taken
