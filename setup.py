"""Build hook: the wheel carries the Ansible collection (roles, playbooks, plugins, meta, manifests).

The collection goes to ``gpufleet/_data/ansible_collections/gpufleet/gpufleet/`` inside the package, the
way DebOps ships its collection in its Python package, so that ``pip install gpufleet`` is the whole
product: ``gpufleet.paths.project_root()`` finds it there when there is no checkout. Everything else is
in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
COLLECTION = ("site.yml", "ansible.cfg", "galaxy.yml", "LICENSE", "README.md")
COLLECTION_DIRS = ("roles", "playbooks", "plugins", "meta", "offline_bundle", "templates", "changelogs")
TARGET = Path("gpufleet", "_data", "ansible_collections", "gpufleet", "gpufleet")
JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache")


class BuildWithCollection(build_py):  # type: ignore[misc]
    """build_py, then copy the collection into the built package."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / TARGET
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name in COLLECTION:
            if (HERE / name).is_file():
                shutil.copy2(HERE / name, target / name)
        for name in COLLECTION_DIRS:
            if (HERE / name).is_dir():
                shutil.copytree(HERE / name, target / name, ignore=JUNK)


setup(cmdclass={"build_py": BuildWithCollection})
