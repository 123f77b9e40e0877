"""The lookup gpufleet_inputs (issue 15, the fast no-op re-run): a role skips its converge only while this
digest is the one its last converge recorded, so it must change with every input and stay put without one."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
SET_FACT = ("ansible.builtin.set_fact", "set_fact")


def run_time_facts() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location(
        "gpufleet_inputs", REPO / "plugins/lookup/gpufleet_inputs.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    facts: tuple[str, ...] = module.RUN_TIME_FACTS
    return facts


def tasks_in(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, list):
        for item in node:
            yield from tasks_in(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            yield from tasks_in(node.get(key))


def published_facts() -> set[str]:
    """Every fact a role or playbook sets under a name that is not internal (``__``)."""
    names = set()
    for path in [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/**/*.yml")]:
        for task in tasks_in(yaml.safe_load(path.read_text(encoding="utf-8"))):
            for key in SET_FACT:
                if isinstance(task.get(key), dict):
                    names |= {name for name in task[key] if not name.startswith("__") and name != "cacheable"}
    return names


def test_every_fact_the_roles_publish_is_left_out_of_the_digest() -> None:
    """A published fact in the digest would make it differ between the check and the next run's check."""
    missing = published_facts() - set(run_time_facts())
    assert not missing, f"add {sorted(missing)} to RUN_TIME_FACTS in plugins/lookup/gpufleet_inputs.py"


def test_the_fact_list_is_not_vacuous() -> None:
    assert {"gpufleet_endpoint", "nvidia_driver_cuda_version", "ray_cluster_alive_nodes"} <= published_facts()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A role `demo` whose only task prints its inputs digest."""
    role = tmp_path / "roles" / "demo"
    (role / "tasks").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "defaults" / "main.yml").write_text("demo_size: 1\n")
    (role / "tasks" / "main.yml").write_text(
        "- name: Print the digest\n"
        "  ansible.builtin.debug:\n"
        "    msg: \"DIGEST={{ lookup('gpufleet_inputs', 'demo_', 'gpufleet_', extra=groups) }}\"\n"
    )
    (tmp_path / "play.yml").write_text("- hosts: localhost\n  gather_facts: false\n  roles: [demo]\n")
    return tmp_path


def digest(project: Path, *extra: str) -> str:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(project / "roles"),
        "ANSIBLE_LOOKUP_PLUGINS": str(REPO / "plugins/lookup"),
        "ANSIBLE_NOCOLOR": "1",
    }
    args = [arg for value in extra for arg in ("-e", value)]
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", str(project / "play.yml"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = [line for line in done.stdout.splitlines() if "DIGEST=" in line]
    return line.split("DIGEST=")[1].strip().strip('"')


@pytest.mark.slow
def test_the_digest_follows_the_inputs_and_nothing_else(project: Path) -> None:
    base = digest(project)
    assert len(base) == 64
    assert digest(project) == base
    # Not inputs: internals, published facts, variables of other roles.
    assert digest(project, "__demo_probe=1", "gpufleet_verify=x", "other_size=5") == base
    # Inputs: the role's own variables (a default overridden), the fleet-wide ones, the caller's extra.
    assert digest(project, "demo_size=2") != base
    assert digest(project, "gpufleet_bundle_dir=/elsewhere") != base
    # Its docs are not an input; its other files are: a changed template or task file is another converge.
    (project / "roles" / "demo" / "README.md").write_text("# demo\n")
    assert digest(project) == base
    (project / "roles" / "demo" / "templates").mkdir()
    (project / "roles" / "demo" / "templates" / "unit.j2").write_text("x\n")
    assert digest(project) != base
