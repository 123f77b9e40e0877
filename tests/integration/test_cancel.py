"""The head's run marker (issue 13 item 4) on the lab, with ``gpufleet teardown`` (it changes hosts, and is
quick on fresh hosts): another control node's live run is refused, a dead one's marker is taken over.

Cancel mid-artifacts (item 3) is asserted by the end-to-end module, whose first deploy is interrupted with
SIGINT before the real one (test_e2e.py, with cancel_support.py): one cold deploy of the lab serves both.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from cancel_support import start_in
from conftest import REPO, VENV_BIN, RunningLab

from gpufleet.runner.head_marker import MARKER_PATH, control_node

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(3600)]


def gpufleet(*args: str, state: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, XDG_STATE_HOME=str(state), PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    return start_in([str(VENV_BIN / "gpufleet"), *args], cwd=REPO, env=env)


def put_marker(lab: RunningLab, host: str, **fields: object) -> None:
    text = json.dumps(fields)
    done = lab.lab.ssh(host, f"mkdir -p {MARKER_PATH.parent} && cat > {MARKER_PATH}", stdin=text, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_heads_marker_refuses_another_control_nodes_run_and_a_dead_one_is_taken_over(
    lab: RunningLab, tmp_path: Path
) -> None:
    """Item 4 on the lab, with `gpufleet teardown` (changes hosts, and is quick on fresh hosts)."""
    inventory, head = lab.lab.reset().inventory, lab.hosts[0]  # fresh hosts, whatever ran before
    try:
        since = time.time() - 30
        put_marker(
            lab, head, run_id="0" * 32, control="ops@elsewhere", pid=4242, action="deploy", started=since
        )
        refused = gpufleet("teardown", "-i", str(inventory), "--json", state=tmp_path / "a")
        stdout, stderr = refused.communicate(timeout=600)
        assert refused.returncode == 2, stdout + stderr
        said = " ".join(json.loads(stdout)["problems"])
        assert (
            "another gpufleet run holds this fleet: deploy run 000000000000 of ops@elsewhere (pid 4242)"
            in said
        )
        assert "since " + time.strftime("%Y-%m-%d %H:%M", time.gmtime(since)) in said, said
        assert json.loads(lab.ssh(head, ["cat", str(MARKER_PATH)]).stdout)["control"] == "ops@elsewhere"

        gone = subprocess.Popen(["true"])
        gone.wait()
        put_marker(
            lab, head, run_id="1" * 32, control=control_node(), pid=gone.pid, action="deploy", started=since
        )
        taken = gpufleet("teardown", "-i", str(inventory), "--json", state=tmp_path / "b")
        stdout, stderr = taken.communicate(timeout=600)
        assert taken.returncode == 0, stdout[-3000:] + stderr[-3000:]
        warnings = json.loads(stdout)["warnings"]
        assert any(f"its process (pid {gone.pid}) is gone on this control node" in w for w in warnings), (
            warnings
        )
        assert lab.ssh(head, ["test", "-e", str(MARKER_PATH)]).returncode == 1  # released at the end
    finally:
        lab.ssh(head, ["rm", "-f", str(MARKER_PATH)])
