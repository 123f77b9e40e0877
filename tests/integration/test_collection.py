"""The Galaxy collection: built, installed with ansible-galaxy, its playbooks run by their collection names.

Installed into a temporary collections path, with an empty ansible.cfg, so that nothing of the checkout
(roles_path, plugin paths) helps: `gpufleet.gpufleet.site` must pass Ansible's syntax check (every role,
module and plugin resolved from the collection), and one real stage, `gpufleet.gpufleet.preflight`'s
validation, runs (the action plugin needs the gpufleet Python package, here the venv's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from tests.module_calls import MODULES, answer, argv, call, module_play

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built tarball, installed under a fresh collections path; returns that path's parent."""
    work = tmp_path_factory.mktemp("collection")
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work), str(REPO)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (tarball,) = work.glob("gpufleet-gpufleet-*.tar.gz")
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(work / "cols"), str(tarball)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (work / "ansible.cfg").write_text("[defaults]\n")
    return work


def collection_env(collection: Path) -> dict[str, str]:
    """The installed collection and the empty ansible.cfg: nothing of the checkout."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "ANSIBLE_COLLECTIONS_PATH": str(collection / "cols"),
        "ANSIBLE_CONFIG": str(collection / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
    }


def playbook(collection: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ansible-playbook"), *args],
        cwd=collection, env=collection_env(collection),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_the_tarball_holds_the_collection_only(collection: Path) -> None:
    (tarball,) = collection.glob("gpufleet-gpufleet-*.tar.gz")
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    assert {
        "playbooks/site.yml",
        "plugins/modules/gpufleet_model_check.py",
        "LICENSE",
        "meta/runtime.yml",
    } <= set(names)
    assert "changelogs/changelog.yaml" in names
    assert "tests/sanity/ignore-2.19.txt" in names  # ansible-test's, part of the collection
    outside = (
        "src/",
        "tests/unit",
        "tests/integration",
        "tests/gpu",
        "molecule/",
        "benchmarks/",
        ".venv/",
        "Makefile",
    )
    for kept_out in (*outside, "setup.py"):
        assert not [name for name in names if name.startswith(kept_out)], kept_out
    # of tests/, ansible-test's ignore files only: no test helper (tests/monitoring_assets.py shipped once)
    helpers = [name for name in names if name.startswith("tests/") and not name.startswith("tests/sanity")]
    assert helpers == [], helpers


def test_site_passes_the_syntax_check_by_its_collection_name(collection: Path) -> None:
    result = playbook(
        collection, "gpufleet.gpufleet.site", "--syntax-check", "-i", str(REPO / "inventories/prod")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gpufleet/gpufleet/playbooks/site.yml" in result.stdout


def test_one_real_stage_runs_from_the_collection(collection: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "prod"
    shutil.copytree(REPO / "inventories" / "prod", inventory)
    group_vars = inventory / "group_vars" / "gpu_nodes.yml"
    group_vars.write_text(group_vars.read_text().replace("../../models/", f"{REPO}/models/"))
    result = playbook(
        collection, "gpufleet.gpufleet.preflight", "-i", str(inventory), "--tags", "preflight_validate"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: [gpu-head-01 -> localhost]" in result.stdout


@pytest.mark.parametrize("module", MODULES)
def test_a_module_finds_its_shared_code_in_the_collection(
    collection: Path, tmp_path: Path, module: str
) -> None:
    """Ansible packs the collection's plugins/module_utils (nothing here names a module_utils path, as a
    checkout's ansible.cfg does)."""
    args, key, expected = call(module, tmp_path)
    done = subprocess.run(
        argv(BIN / "ansible-playbook", module_play(f"gpufleet.gpufleet.{module}", args, tmp_path)),
        cwd=collection, env=collection_env(collection),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    result = answer(tmp_path, done)
    assert result.get(key) in expected, result


# ansible-test bootstraps pip in each of its venvs with a get-pip script it downloads from a site beyond the
# package index; here the same bootstrap runs pip from its own wheel, fetched from the index.
PIP_BOOTSTRAP = '''"""ansible-test's pip bootstrap, run from pip's wheel (from the package index)."""
import glob, os, sys
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, glob.glob(os.path.join(here, "pip-{v}-*.whl"))[0])
from pip._internal.cli.main import main
sys.exit(main(["install", *[a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]]))
'''


def pip_bootstrap() -> None:
    from ansible_test._internal.python_requirements import get_venv_packages

    python = type("Python", (), {"version": f"{sys.version_info[0]}.{sys.version_info[1]}"})
    version = get_venv_packages(python)["pip"]
    cache = Path.home() / ".ansible" / "test" / "cache"
    script = cache / f"get_pip_{version.replace('.', '_')}.py"
    if not list(cache.glob(f"pip-{version}-*.whl")):
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache), f"pip=={version}"],
            check=True, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    script.write_text(PIP_BOOTSTRAP.replace("{v}", version))


def test_ansible_test_sanity_passes_on_the_installed_collection(collection: Path) -> None:
    """Every offline sanity test of ansible-test, on the collection as Galaxy users get it."""
    pip_bootstrap()
    root = collection / "cols" / "ansible_collections" / "gpufleet" / "gpufleet"
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)  # ansible-test lists files with git
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    result = subprocess.run(
        [str(BIN / "ansible-test"), "sanity", "--local", "--python", python, "--color", "no"],
        cwd=root, env=env, capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    errors = [
        line for line in (result.stdout + result.stderr).splitlines() if line.startswith(("ERROR", "FATAL"))
    ]
    assert result.returncode == 0, "\n".join(errors[-40:]) or result.stderr[-3000:]
