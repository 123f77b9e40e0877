"""One call of each module that imports plugins/module_utils, in a play on localhost, for each way
gpufleet's modules run: from a checkout (tests/unit/test_module_utils.py), from the installed collection
(tests/integration/test_collection.py) and from the wheel (tests/integration/test_install.py). A module
that did not get its shared code fails at its import on the node: its result has no answer of its own."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

MODULES = ("gpufleet_model_check", "gpufleet_revision", "gpufleet_vllm_wait")
CONFIG = b"{}"


def call(module: str, tmp_path: Path) -> tuple[dict[str, Any], str, tuple[Any, ...]]:
    """The module's arguments, a key of its answer and the values it may have there."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_bytes(CONFIG)
    listed = {"config.json": {"sha256": hashlib.sha256(CONFIG).hexdigest(), "size": len(CONFIG)}}
    return {
        "gpufleet_model_check": (
            {"path": str(tmp_path / "model"), "repo": "org/tiny", "files": listed, "state": "record"},
            "recorded",
            (True,),
        ),
        "gpufleet_revision": (
            {"root": str(tmp_path / "revisions")},
            "revisions",
            ({"current": None, "previous": None},),
        ),
        "gpufleet_vllm_wait": (
            {
                "url": "http://127.0.0.1:9",  # nothing listens: the wait ends at its timeout, or on the unit
                "api_key": "k",
                "served_model": "tiny",
                "unit": "gpufleet-test-no-such.service",
                "timeout": 1,
            },
            "why",
            ("timeout", "failed"),
        ),
    }[module]


def module_play(module: str, args: dict[str, Any], tmp_path: Path) -> Path:
    """A play on localhost: ``module`` with ``args`` (a failure kept, not raised), its result then written to
    ``tmp_path``/result.json (read by ``answer``)."""
    tasks = [
        {"name": "Run the module", module: args, "register": "result", "failed_when": False},
        {
            "name": "Keep its result",
            "ansible.builtin.copy": {
                "content": "{{ result | to_json }}",
                "dest": str(tmp_path / "result.json"),
                "mode": "0644",
            },
        },
    ]
    path = tmp_path / "play.yml"
    path.write_text(
        json.dumps([{"name": "One module", "hosts": "localhost", "gather_facts": False, "tasks": tasks}])
    )
    return path


def argv(ansible_playbook: Path, playbook: Path, python: str = sys.executable) -> list[str]:
    """``ansible-playbook`` running ``playbook`` on localhost (no inventory but that) with ``python``."""
    local = ["-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={python}"]
    return [str(ansible_playbook), *local, str(playbook)]


def answer(tmp_path: Path, done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The module's result, as the play kept it."""
    kept = tmp_path / "result.json"
    assert kept.exists(), done.stdout + done.stderr
    result: dict[str, Any] = json.loads(kept.read_text())
    return result
