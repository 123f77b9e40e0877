"""The modules' shared host-side code (plugins/module_utils, issue 34 step 5): a file's sha256, the model
marker, a unit's properties; and that a module finds it when Ansible runs it from this checkout (ansible.cfg's
module_utils path). From the installed collection and from the wheel: tests/integration/test_collection.py
and test_install.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpufleet.runner.arguments import STRATEGIES, STRATEGY_ENV, strategy_env

from ..module_calls import MODULES, answer, argv, call, module_play
from .conftest import REPO

ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
SYSTEMCTL_DOUBLE = REPO / "tests/doubles/systemctl-double.sh"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "plugins/module_utils" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


files = load("gpufleet_files")
units = load("gpufleet_units")


@pytest.mark.parametrize("size", [0, 1, files.CHUNK - 1, files.CHUNK, 2 * files.CHUNK + 5])
def test_sha256_is_the_hash_of_the_whole_file_across_chunks(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    (tmp_path / "weights").write_bytes(data)

    assert files.sha256(str(tmp_path / "weights")) == hashlib.sha256(data).hexdigest()


def test_a_written_marker_reads_back_in_the_format_the_modules_always_wrote(tmp_path: Path) -> None:
    marker = {"repo": "org/tiny", "revision": "a" * 40, "files": {"config.json": {"sha256": "b", "size": 2}}}
    (tmp_path / ".gpufleet-model.json").write_text("{}")

    files.write_model_marker(str(tmp_path), marker)

    assert files.read_model_marker(str(tmp_path)) == marker
    written = (tmp_path / ".gpufleet-model.json").read_text()
    assert written == json.dumps(marker, indent=1, sort_keys=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == [".gpufleet-model.json"]  # no .tmp left


@pytest.mark.parametrize("content", [None, "", '{"repo": "org/tiny", "revision"'])
def test_a_missing_or_broken_marker_reads_as_none(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / files.MODEL_MARKER).write_text(content)

    assert files.read_model_marker(str(tmp_path)) is None


def test_unit_properties_asks_systemctl_show_for_each_property_and_reads_them_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the systemctl double (tests/doubles): systemd is not PID 1 on this machine."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "systemctl").symlink_to(SYSTEMCTL_DOUBLE)
    (tmp_path / "show").write_text(
        "NRestarts=3\nActiveState=activating\nExecStart={ argv[]=/x a=b }\nnoise\n"
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SYSTEMCTL_DOUBLE_DIR", str(tmp_path))

    got = units.unit_properties("gpufleet-vllm.service", ("NRestarts", "ActiveState"))

    assert (tmp_path / "argv").read_text().splitlines() == [
        "show",
        "--property=NRestarts",
        "--property=ActiveState",
        "gpufleet-vllm.service",
    ]
    assert got == {"NRestarts": "3", "ActiveState": "activating", "ExecStart": "{ argv[]=/x a=b }"}


def test_a_unit_that_does_not_exist_is_never_reported_running() -> None:
    """The real systemctl: systemd says inactive, or (not PID 1, as on this machine) nothing at all."""
    got = units.unit_properties("gpufleet-test-no-such.service", ("ActiveState", "NRestarts"))

    assert got in ({}, {"ActiveState": "inactive", "NRestarts": "0"})


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("module", MODULES)
def test_a_module_finds_its_shared_code_when_run_from_the_checkout(
    tmp_path: Path, module: str, strategy: str
) -> None:
    """Ansible packs plugins/module_utils from the path ansible.cfg names (module_utils, beside library);
    mitogen's strategy (gpufleet deploy's) sends it to the node itself."""
    args, key, expected = call(module, tmp_path)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    env |= strategy_env({STRATEGY_ENV: strategy})
    done = subprocess.run(
        argv(ANSIBLE_PLAYBOOK, module_play(module, args, tmp_path)),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    result = answer(tmp_path, done)
    assert result.get(key) in expected, result
