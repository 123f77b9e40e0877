"""The wheel is the whole product: built from this checkout, installed into a fresh venv outside it.

The venv has no access to the checkout (cwd elsewhere, GPUFLEET_HOME unset), so everything the installed
``gpufleet`` uses — roles' argument specs, playbooks, the bundle manifest, the init templates — must come
from the wheel. Dependencies come from the package index (pip's cache after the first run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import installed_env, run_installed
from tests.module_calls import MODULES, answer, argv, call, module_play

REPO = Path(__file__).resolve().parents[2]
COLLECTION = "gpufleet/_data/ansible_collections/gpufleet/gpufleet/"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_wheel_carries_the_collection_and_nothing_of_the_checkout(gpufleet_wheel: Path) -> None:
    names = zipfile.ZipFile(gpufleet_wheel).namelist()
    for needed in (
        "site.yml", "ansible.cfg", "galaxy.yml", "LICENSE", "playbooks/nodes.yml",
        "roles/docker/meta/argument_specs.yml", "roles/vllm_service/tasks/main.yml",
        "plugins/action/gpufleet_validate.py", "offline_bundle/manifest.yml",
        "templates/inventory/hosts.yml.j2",
    ):  # fmt: skip
        assert COLLECTION + needed in names, needed
    for leaked in ("tests/", "molecule/", "benchmarks/", "src/", ".venv/", "__pycache__"):
        assert not [name for name in names if f"/{leaked}" in name or name.startswith(leaked)], leaked


def test_the_installed_wheel_still_catches_a_role_variable_typo(
    installed_gpufleet: Path, tmp_path: Path
) -> None:
    """Before: from the wheel alone, `nvidia_driver_reboott: true` was "valid" (no role specs to read)."""
    inventory = tmp_path / "inv"
    made = run_installed(
        installed_gpufleet, "init", str(inventory), "--head", "gpu-head-01=192.0.2.10",
        "--model", "Qwen/Qwen3-8B", "--gpu", "NVIDIA H800", cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    good = run_installed(installed_gpufleet, "validate", "-i", str(inventory), cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    with (inventory / "group_vars" / "gpu_nodes.yml").open("a") as handle:
        handle.write("nvidia_driver_reboott: true\n")
    typo = run_installed(installed_gpufleet, "validate", "-i", str(inventory), cwd=tmp_path)
    assert typo.returncode == 1
    assert "nvidia_driver_reboott" in typo.stderr and "nvidia_driver_reboot" in typo.stderr, typo.stderr


def test_the_installed_wheel_finds_its_playbooks_and_manifest(
    installed_gpufleet: Path, tmp_path: Path
) -> None:
    where = subprocess.run(
        [str(installed_gpufleet / "python"), "-c", "import gpufleet.paths as p; print(p.project_root())"],
        cwd=tmp_path, capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    root = Path(where.stdout.strip())
    assert root.is_relative_to(installed_gpufleet.parent), root  # the venv's copy, not the checkout
    assert (root / "playbooks" / "preflight.yml").is_file()
    assert (root / "offline_bundle" / "manifest.yml").is_file()
    help_text = run_installed(installed_gpufleet, "bundle", "build", "--help", cwd=tmp_path)
    assert help_text.returncode == 0 and "--manifest" in help_text.stdout


STRATEGY_OF_THE_RUNNER = (  # the strategy the installed gpufleet's runner chooses, as its environment
    "import json, os; from gpufleet.runner.arguments import strategy_env; "
    "print(json.dumps(strategy_env(os.environ)))"
)


@pytest.mark.parametrize("module", MODULES)
def test_the_installed_wheel_runs_a_module_with_its_shared_code(
    installed_gpufleet: Path, tmp_path: Path, module: str
) -> None:
    """As `gpufleet deploy` from the wheel runs its roles: the venv's ansible under the runner's strategy,
    with the collection's ansible.cfg, whose module_utils path (beside library) gives the module its shared
    code."""
    python = installed_gpufleet / "python"
    (config,) = installed_gpufleet.parent.glob(f"lib/python3*/site-packages/{COLLECTION}ansible.cfg")
    strategy = subprocess.run(
        [str(python), "-c", STRATEGY_OF_THE_RUNNER], env=installed_env(installed_gpufleet),
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    env = installed_env(installed_gpufleet) | json.loads(strategy.stdout)
    env |= {"ANSIBLE_CONFIG": str(config), "ANSIBLE_NOCOLOR": "1"}
    args, key, expected = call(module, tmp_path)
    play = module_play(module, args, tmp_path)
    done = subprocess.run(
        argv(installed_gpufleet / "ansible-playbook", play, python=str(python)),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    result = answer(tmp_path, done)
    assert result.get(key) in expected, result


def wheels_manifest(tmp_path: Path) -> Path:
    """The production manifest's `wheels` entry alone (the rest needs the internet beyond PyPI)."""
    manifest = yaml.safe_load((REPO / "offline_bundle" / "manifest.yml").read_text())
    path = tmp_path / "manifest.yml"
    kept = {key: manifest[key] for key in ("schema_version", "name", "wheels")}
    path.write_text(yaml.safe_dump(kept))
    return path


def test_the_bundle_wheelhouse_installs_gpufleet_with_no_index(tmp_path: Path) -> None:
    """`gpufleet bundle build` puts gpufleet and every dependency, pinned in the lock, into wheels/."""
    from gpufleet.bundle import build, read_lock

    bundle = tmp_path / "bundle"
    result = build(wheels_manifest(tmp_path), bundle)
    lock = read_lock(bundle)
    wheels = [entry for entry in lock.files if entry.path.startswith("wheels/")]
    assert [entry.path for entry in wheels] == [entry.path for entry in result.lock.files]
    names = {Path(entry.path).name.split("-")[0].lower() for entry in wheels}
    assert {"gpufleet", "ansible_core", "pydantic_core", "pydantic"} <= names
    for python in ("cp311", "cp312"):  # a binary dependency for each Python the control node may have
        assert any(f"-{python}-" in entry.path and "pydantic_core" in entry.path for entry in wheels), python
    assert all(len(entry.sha256) == 64 and entry.version for entry in wheels)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    started = time.monotonic()
    offline = subprocess.run(
        [str(venv / "bin/pip"), "install", "--no-index", "--find-links", str(bundle / "wheels"), "gpufleet"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert offline.returncode == 0, offline.stderr[-2000:]
    seconds = time.monotonic() - started
    version = subprocess.run(
        [str(venv / "bin/gpufleet"), "--version"], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert version.stdout.startswith("gpufleet "), version.stdout
    print(f"offline install of gpufleet from the bundle's wheels: {seconds:.1f} s")
