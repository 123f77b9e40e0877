"""One run at a time per fleet (issue 13): a second deploy of the same inventory is refused at once,
naming who holds the fleet since when; a holder that died (SIGKILL) leaves no lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.runner import DeployError, deploy
from gpufleet.runner.fleet_lock import FleetBusyError, fleet_lock

REPO = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
from pathlib import Path
from gpufleet.runner.fleet_lock import fleet_lock
with fleet_lock(Path(sys.argv[1]), "deploy"):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def holder(state: Path) -> Iterator[subprocess.Popen[str]]:
    """Another gpufleet process holding the prod inventory's fleet."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(REPO / "inventories" / "prod")],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "XDG_STATE_HOME": str(state)},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_deploy_is_refused_naming_the_holder(
    holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[object] = []
    monkeypatch.setattr("gpufleet.runner.api.run_stages", lambda *args: ran.append(args) or ([], {}))
    with pytest.raises(DeployError) as refused:
        deploy(REPO / "inventories" / "prod", validate_inventory=False)
    message = str(refused.value)
    assert f"pid {holder.pid}" in message and "deploy) since" in message and "Fix: wait" in message
    assert ran == []  # nothing ran on any host


def test_the_lock_of_a_killed_run_is_taken_over(holder: subprocess.Popen[str]) -> None:
    with pytest.raises(FleetBusyError), fleet_lock(REPO / "inventories" / "prod", "deploy"):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with fleet_lock(REPO / "inventories" / "prod", "deploy"):
        pass  # taken: the kernel released the dead holder's flock


def test_other_fleets_are_not_blocked(holder: subprocess.Popen[str], tmp_path: Path) -> None:
    other = tmp_path / "other-inventory"
    other.mkdir()
    with fleet_lock(other, "deploy"):
        pass
