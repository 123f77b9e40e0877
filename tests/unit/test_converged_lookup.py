"""The lookup gpufleet_inputs (issue 15, the fast no-op re-run): a role skips its converge only while this
digest is the one its last converge recorded, so it must change with every input and stay put without one."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
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


def run_time_groups() -> frozenset[str]:
    spec = importlib.util.spec_from_file_location(
        "gpufleet_inputs", REPO / "plugins/lookup/gpufleet_inputs.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    groups: frozenset[str] = module.RUN_TIME_GROUPS
    return groups


def made_groups() -> set[str]:
    """Every group a playbook or role makes at run time (group_by keys, add_host groups), by the names quoted
    in them."""
    names = set()
    for path in [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/**/*.yml")]:
        for task in tasks_in(yaml.safe_load(path.read_text(encoding="utf-8"))):
            for key in ("ansible.builtin.group_by", "group_by", "ansible.builtin.add_host", "add_host"):
                if isinstance(task.get(key), dict):
                    made = str(task[key].get("key") or task[key].get("groups") or "")
                    names |= set(re.findall(r"'([a-z_]+)'", made)) | (
                        {made} if made.isidentifier() else set()
                    )
    return names


def test_every_group_a_run_makes_is_left_out_of_the_fleet_digest() -> None:
    """A group made during a run, in the fleet's digest, makes the digest at the run's end differ from the one
    at its start: fleet_record.yml then records nothing, and the next deploy takes no fast path."""
    made = made_groups()
    assert {"gpufleet_in_sync", "gpufleet_serve_services", "gpufleet_serve_one_model"} <= made, made
    missing = made - run_time_groups()
    assert not missing, f"add {sorted(missing)} to RUN_TIME_GROUPS in plugins/lookup/gpufleet_inputs.py"


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


def printed_digest(argv: list[str], env: dict[str, str]) -> str:
    """The DIGEST= line an ansible-playbook run printed (run from the repository, lookups from plugins/)."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_LOOKUP_PLUGINS": str(REPO / "plugins/lookup"),
        "ANSIBLE_NOCOLOR": "1",
        **env,
    }
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), *argv],
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


def digest(project: Path, *extra: str, lookups: Path = REPO / "plugins/lookup") -> str:
    args = [arg for value in extra for arg in ("-e", value)]
    argv = ["-i", "localhost,", "-c", "local", str(project / "play.yml"), *args]
    return printed_digest(
        argv, {"ANSIBLE_ROLES_PATH": str(project / "roles"), "ANSIBLE_LOOKUP_PLUGINS": str(lookups)}
    )


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


@pytest.mark.slow
@pytest.mark.parametrize("edited", ["modules/gpufleet_model_check.py", "module_utils/gpufleet_files.py"])
def test_the_digest_follows_the_modules_and_the_code_they_share(project: Path, edited: str) -> None:
    """A role's modules run plugins/module_utils too: an edit there is another converge, as in a module."""
    plugins = project / "plugins"
    shutil.copytree(REPO / "plugins", plugins, ignore=shutil.ignore_patterns("__pycache__"))
    base = digest(project, lookups=plugins / "lookup")
    with (plugins / edited).open("a") as changed:
        changed.write("# edited\n")

    assert digest(project, lookups=plugins / "lookup") != base


def fleet_digest(tmp_path: Path, inventory: str, *extra: str) -> str:
    """The whole deploy's digest (fleet=true), printed by a play on one host of a two-host inventory."""
    (tmp_path / "hosts.ini").write_text(inventory)
    (tmp_path / "fleet.yml").write_text(
        "- hosts: a\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n"
        "        msg: \"DIGEST={{ lookup('gpufleet_inputs', fleet=true, files=[key_file]).digest }}\"\n"
    )
    args = ["-e", f"key_file={tmp_path / 'gpufleet.apikey'}", *[a for value in extra for a in ("-e", value)]]
    return printed_digest(
        ["-i", str(tmp_path / "hosts.ini"), "-c", "local", str(tmp_path / "fleet.yml"), *args], {}
    )


@pytest.mark.slow
def test_the_fleet_digest_follows_every_host_and_the_control_node_files(tmp_path: Path) -> None:
    """The fast path of a whole deploy (playbooks/fleet_check.yml) skips every stage while this holds:
    another host's role variable, group membership or the API key's contents must change it; what no role
    reads must not."""
    inventory = "[gpu_nodes]\na\nb docker_version=27.5.1 gpufleet_node_ip=10.0.0.2\n[ray_head]\na\n"
    base = fleet_digest(tmp_path, inventory)
    assert len(base) == 64
    assert fleet_digest(tmp_path, inventory) == base
    assert fleet_digest(tmp_path, inventory.replace("27.5.1", "28.0.0")) != base  # a role's input, on b
    assert fleet_digest(tmp_path, inventory.replace("10.0.0.2", "10.0.0.3")) != base  # a fleet variable, on b
    assert (
        fleet_digest(tmp_path, inventory.replace("[ray_head]\na", "[ray_head]\nb")) != base
    )  # the head moved
    assert fleet_digest(tmp_path, inventory + "[extra]\nb\n") != base  # groups are an input
    assert fleet_digest(tmp_path, inventory, "gpufleet_verify=x", "__docker_probe=1", "other_size=5") == base
    (tmp_path / "gpufleet.apikey").write_text("k" * 64)
    with_key = fleet_digest(tmp_path, inventory)
    assert with_key != base
    (tmp_path / "gpufleet.apikey").write_text("r" * 64)  # a rotated key: vllm_service renders it
    assert fleet_digest(tmp_path, inventory) != with_key


@pytest.mark.slow
def test_a_role_that_serves_nothing_leaves_what_the_fleet_serves_out(project: Path) -> None:
    """serving=false: a model added or a service raised is no input of a host's Docker or driver (found on
    `make demo`: raising tiny from 2 replicas to 3 converged Docker, the driver, CUDA, the toolkit and the
    images again on every node, about 30 s of the deploy), while every other fleet-wide variable stays one."""
    tasks = project / "roles" / "demo" / "tasks" / "main.yml"
    served = '[{"name": "tiny", "replicas": 3}]'
    assert digest(project, f"gpufleet_services={served}") != digest(project)  # by default it counts
    tasks.write_text(tasks.read_text().replace("extra=groups)", "extra=groups, serving=false)"))
    base = digest(project)
    assert digest(project, f"gpufleet_services={served}", "gpufleet_model_repo=org/other") == base
    assert digest(project, "gpufleet_bundle_dir=/elsewhere") != base
    assert digest(project, "gpufleet_models_extra=1") != base  # a prefix leaves out what it names only


def test_the_roles_that_leave_the_served_out_never_read_it() -> None:
    """A role whose digest leaves out what the fleet serves (serving=false) must not read it: a change of it
    would leave the role's converge skipped on a node that needs it."""
    leaving = sorted(
        role.name
        for role in (REPO / "roles").iterdir()
        if (role / "vars" / "main.yml").is_file()
        if "serving=false" in (role / "vars" / "main.yml").read_text(encoding="utf-8")
    )
    assert leaving == sorted(
        ["cuda_toolkit", "docker", "image_distribution", "nvidia_container_toolkit", "nvidia_driver"]
    )
    read = {
        (role, str(path.relative_to(REPO)), name)
        for role in leaving
        for path in (REPO / "roles" / role).rglob("*")
        if path.is_file() and path.suffix in {".yml", ".yaml", ".j2", ".py", ".sh"}
        for name in ("gpufleet_services", "gpufleet_model_", "gpufleet_placement")
        if name in path.read_text(encoding="utf-8")
    }
    assert not read, read
