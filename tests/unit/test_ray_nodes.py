"""roles/ray_cluster/files/ray_nodes.py, the cluster stage's wait probe, against a TEST DOUBLE of Ray.

Ray exists only inside the serving image; here a stand-in package named ``ray`` (written into tmp_path,
put first on PYTHONPATH) answers ``ray.nodes()`` with the nodes each test gives it. The real probe ran against
Ray 2.60 in the lab (test_e2e) and on the GPU machine (tests/gpu/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "roles" / "ray_cluster" / "files" / "ray_nodes.py"
EXPECTED = [
    {"host": "node1", "ip": "10.0.0.11", "gpus": 1},
    {"host": "node2", "ip": "10.0.0.12", "gpus": 1},
]


def probe(tmp_path: Path, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    double = tmp_path / "ray"
    double.mkdir(exist_ok=True)
    (double / "__init__.py").write_text(
        "import json, os\n"
        "def init(**kwargs): pass\n"
        "def shutdown(): pass\n"
        "def nodes(): return json.loads(os.environ['RAY_DOUBLE_NODES'])\n",
        encoding="utf-8",
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path), RAY_DOUBLE_NODES=json.dumps(nodes))
    run = subprocess.run(
        [sys.executable, str(PROBE), json.dumps(EXPECTED), "10.0.0.11:6379"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def node(ip: str, gpus: float) -> dict[str, Any]:
    return {"Alive": True, "NodeManagerAddress": ip, "Resources": {"CPU": 4.0, "GPU": gpus}}


def test_every_node_with_its_gpus_is_nothing_missing(tmp_path: Path) -> None:
    result = probe(tmp_path, [node("10.0.0.11", 1), node("10.0.0.12", 1)])
    assert result["missing"] == [] and result["unknown"] == []


def test_a_node_registered_under_another_address_is_named(tmp_path: Path) -> None:
    """The worker's Ray took another NIC's address (172.17.0.1), not its gpufleet_node_ip."""
    result = probe(tmp_path, [node("10.0.0.11", 1), node("172.17.0.1", 1)])
    (missing,) = result["missing"]
    assert missing["host"] == "node2"
    assert "Ray has node(s) at 172.17.0.1, which the inventory does not name" in missing["why"]
    assert result["unknown"] == ["172.17.0.1"]


def test_more_gpus_than_declared_is_refused_too(tmp_path: Path) -> None:
    """GPUs Ray sees != GPUs the inventory declares: 8 where 1 is declared is a wrong inventory (or a wrong
    CUDA_VISIBLE_DEVICES), not a pass."""
    result = probe(tmp_path, [node("10.0.0.11", 8), node("10.0.0.12", 1)])
    (missing,) = result["missing"]
    assert missing["host"] == "node1"
    assert "Ray sees 8 GPU(s), the inventory declares gpufleet_gpu_count=1" in missing["why"]


def test_fewer_gpus_than_declared_is_refused(tmp_path: Path) -> None:
    result = probe(tmp_path, [node("10.0.0.11", 1), node("10.0.0.12", 0)])
    (missing,) = result["missing"]
    assert missing["host"] == "node2" and "Ray sees 0 GPU(s)" in missing["why"]
