"""gpufleet_converged (issue 15, the fast no-op re-run): a role skips its converge only while the node is what
its last converge left. Run as Ansible runs it (a subprocess with its arguments file) on real files in a
temporary directory; systemd units are checked in the lab (tests/integration/test_e2e.py), where systemd
runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "plugins/modules/gpufleet_converged.py"
DIGEST = "d" * 64


class Node:
    """A role's managed files, a tree (a model directory) and a read-only probe, under one tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "etc" / "daemon.json"
        self.config.parent.mkdir()
        self.config.write_text('{"storage-driver": "overlay2"}\n')
        self.tree = root / "models" / "tiny"
        self.tree.mkdir(parents=True)
        (self.tree / "model.safetensors").write_bytes(b"weights")
        self.probe = root / "image-id"
        self.probe.write_text("sha256:aaaa\n")

    def module(self, check: bool = False, env: dict[str, str] | None = None, **args: Any) -> dict[str, Any]:
        params = {
            "name": "docker",
            "digest": DIGEST,
            "root": str(self.root / "stamps"),
            "files": [str(self.config), str(self.root / "absent.conf")],
            "trees": [str(self.tree)],
            "commands": [["cat", str(self.probe)]],
            **args,
        }
        if check:
            params["_ansible_check_mode"] = True
        arguments = self.root / "args.json"
        arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
        argv = [sys.executable, str(MODULE), str(arguments)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    @property
    def stamp(self) -> Path:
        return self.root / "stamps" / "docker.json"


@pytest.fixture
def node(tmp_path: Path) -> Node:
    node = Node(tmp_path)
    recorded = node.module(state="record", facts={"gpufleet_docker_version": "20.10.24"})
    assert recorded["changed"] is False
    return node


def test_a_node_without_a_stamp_converges(tmp_path: Path) -> None:
    result = Node(tmp_path).module()
    assert (result["in_sync"], result["why"]) == (False, "no converge recorded on this node yet")


def test_an_unchanged_node_is_in_sync_and_gets_the_recorded_facts_back(node: Node) -> None:
    result = node.module()
    assert result["in_sync"] is True
    assert result["changed"] is False
    assert result["ansible_facts"] == {"gpufleet_docker_version": "20.10.24"}
    assert oct(node.stamp.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda n: n.config.write_text('{"storage-driver": "vfs"}\n'), "daemon.json changed"),
        (lambda n: n.config.chmod(0o666), "daemon.json changed"),
        (lambda n: (n.root / "absent.conf").write_text("x"), "absent.conf changed"),
        (lambda n: (n.tree / "model.safetensors").write_bytes(b"WEIGHTS"), "tiny changed"),
        (lambda n: (n.tree / "extra.safetensors").write_bytes(b"injected"), "tiny changed"),
        (lambda n: n.probe.write_text("sha256:bbbb\n"), "answers differently"),
    ],
    ids=["edited", "chmod", "appeared", "weights edited", "file added to tree", "probe output"],
)
def test_any_drift_makes_the_role_converge_and_drops_the_stamp(node: Node, change: Any, named: str) -> None:
    change(node)
    result = node.module()
    assert result["in_sync"] is False
    assert named in result["why"]
    assert "ansible_facts" not in result
    assert not node.stamp.exists()  # a converge that now fails cannot leave a stamp a later run trusts


def test_a_content_change_that_keeps_size_and_mtime_is_still_seen(node: Node) -> None:
    """A file replaced by rename (as copy and template do) has another inode, whatever its times."""
    stat = node.config.stat()
    replacement = node.config.with_suffix(".new")
    replacement.write_text('{"storage-driver": "zfs1"}\n'[: stat.st_size])
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, node.config)
    assert node.module()["in_sync"] is False


def test_other_inputs_make_the_role_converge(node: Node) -> None:
    result = node.module(digest="e" * 64)
    assert (result["in_sync"], result["why"]) == (
        False,
        "the role's inputs or files changed since the last converge",
    )


def test_check_mode_neither_drops_nor_writes_a_stamp(node: Node) -> None:
    node.config.write_text("{}\n")
    assert node.module(check=True)["in_sync"] is False
    assert node.stamp.exists()
    node.stamp.unlink()
    node.module(check=True, state="record")
    assert not node.stamp.exists()


def test_an_unreadable_stamp_is_not_trusted(node: Node) -> None:
    node.stamp.write_text("{not json")
    result = node.module()
    assert result["in_sync"] is False
    assert not node.stamp.exists()


def test_a_host_without_systemd_is_checked_too(node: Node, tmp_path: Path) -> None:
    """No systemctl (the GPU machine's container): the units' state is that, every time; not a failure."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("cat",):
        (bare / tool).symlink_to(f"/bin/{tool}")
    env = {**os.environ, "PATH": str(bare)}
    recorded = node.module(state="record", units=["docker.service"], env=env)
    assert recorded["in_sync"] is True, recorded
    again = node.module(units=["docker.service"], env=env)
    assert again["in_sync"] is True, again


# The fleet stamp (playbooks/fleet_check.yml, fleet_record.yml): one check per node for every role's stamp.
FLEET = "f" * 64


def fleet(node: Node, state: str = "fleet_check", check: bool = False, **args: Any) -> dict[str, Any]:
    """The fleet stamp over the docker role's stamp (the node fixture's), with its own probe of the node."""
    kernel = node.root / "kernel"
    if not kernel.exists():
        kernel.write_text("6.1.0 x86_64\n")
    params: dict[str, Any] = {
        "name": "fleet",
        "state": state,
        "digest": FLEET,
        "roles": ["docker"],
        "files": [],
        "trees": [],
        "commands": [["cat", str(kernel)]],
        **args,
    }
    return node.module(check=check, **params)


@pytest.fixture
def recorded(node: Node) -> Node:
    done = fleet(node, "fleet_record", facts={"gpufleet_revisions": {"current": "abc"}})
    assert (done["in_sync"], done["changed"]) == (True, False), done
    return node


def test_the_fleet_check_holds_while_every_role_stamp_holds_and_returns_their_facts(recorded: Node) -> None:
    result = fleet(recorded)
    assert (result["in_sync"], result["changed"]) == (True, False), result
    assert result["ansible_facts"] == {
        "gpufleet_docker_version": "20.10.24",
        "gpufleet_revisions": {"current": "abc"},
    }


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda n: n.config.write_text('{"storage-driver": "vfs"}\n'), "fleet: docker: "),
        (lambda n: (n.tree / "extra.safetensors").write_bytes(b"injected"), "fleet: docker: "),
        (lambda n: n.probe.write_text("sha256:bbbb\n"), "fleet: docker: "),
        (lambda n: (n.root / "kernel").write_text("6.12.0 x86_64\n"), "fleet: `cat "),
        (lambda n: n.stamp.unlink(), "fleet: docker: no converge recorded"),
        (lambda n: n.module(state="record", digest="e" * 64), "fleet: docker: the role's inputs"),
    ],
    ids=[
        "role file edited",
        "role tree grew",
        "role probe",
        "node probe",
        "role stamp gone",
        "role re-recorded",
    ],
)
def test_any_role_drift_fails_the_fleet_check_and_drops_only_the_fleet_stamp(
    recorded: Node, change: Any, named: str
) -> None:
    change(recorded)
    result = fleet(recorded)
    assert result["in_sync"] is False
    assert named in result["why"], result["why"]
    assert "ansible_facts" not in result
    assert not (recorded.root / "stamps" / "fleet.json").exists()
    # the role's own check still decides for the role (and drops its stamp only when the role drifted)


def test_other_deployment_inputs_or_roles_fail_the_fleet_check(recorded: Node) -> None:
    assert "deployment's inputs" in fleet(recorded, digest="0" * 64)["why"]
    fleet(recorded, "fleet_record")
    assert "roles changed" in fleet(recorded, roles=["docker", "vllm_service"])["why"]


def test_the_fleet_stamp_is_refused_while_a_role_recorded_nothing(recorded: Node) -> None:
    stamp = recorded.root / "stamps" / "fleet.json"
    assert stamp.exists()
    done = fleet(recorded, "fleet_record", roles=["docker", "ray_cluster"])
    assert (done["in_sync"], done["why"]) == (
        False,
        "ray_cluster recorded no converge on this node: no fleet stamp",
    )
    assert not stamp.exists()  # never one that covers less than it names


def test_check_mode_neither_drops_nor_writes_the_fleet_stamp(recorded: Node) -> None:
    stamp = recorded.root / "stamps" / "fleet.json"
    recorded.config.write_text("{}\n")
    assert fleet(recorded, check=True)["in_sync"] is False
    assert stamp.exists()
    stamp.unlink()
    fleet(recorded, "fleet_record", check=True)
    assert not stamp.exists()


def test_the_fleet_check_runs_as_a_script_without_ansible_and_answers_as_the_module(recorded: Node) -> None:
    """playbooks/fleet_check.yml runs the module's copy on the node without Ansible's wrapper (action plugin
    gpufleet_converged): with no site-packages at all (-S: no ansible to import) it must answer as the module
    does, in sync with the facts, then name a drift and drop the fleet stamp."""
    kernel = recorded.root / "kernel"

    def script() -> dict[str, Any]:
        params = {
            "digest": FLEET,
            "roles": ["docker"],
            "commands": [["cat", str(kernel)]],
            "root": str(recorded.root / "stamps"),
        }
        argv = [sys.executable, "-I", "-S", str(MODULE), "--fleet-check", json.dumps(params)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    module = fleet(recorded)
    assert script() == {key: module[key] for key in ("changed", "in_sync", "why", "ansible_facts")}
    recorded.probe.write_text("sha256:cccc\n")
    drifted = script()
    assert (drifted["in_sync"], drifted["why"]) == (
        False,
        f"fleet: docker: `cat {recorded.probe}` answers differently than after the last converge",
    )
    assert not (recorded.root / "stamps" / "fleet.json").exists()


def test_the_fleet_check_asks_systemd_once_for_every_roles_units(tmp_path: Path) -> None:
    """One `systemctl show` for all the roles' units (a unit two roles watch asked once), not one per role:
    systemctl costs a node about 14 ms of CPU a call. systemctl here is the machine's own, behind a wrapper
    that logs each call (it answers the same every time, booted with systemd or not)."""
    log = tmp_path / "systemctl.log"
    bare = tmp_path / "bin"
    bare.mkdir()
    real = shutil.which("systemctl")
    assert real is not None, "systemctl is part of the test machine (apt: systemd)"
    spy = bare / "systemctl"
    spy.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    spy.chmod(0o755)
    env = {**os.environ, "PATH": f"{bare}:{os.environ['PATH']}"}
    node = Node(tmp_path)
    units = {
        "docker": ["containerd.service", "docker.service"],
        "ray_cluster": ["ray.service", "docker.service"],
    }
    for role, role_units in units.items():
        assert node.module(state="record", name=role, units=role_units, env=env)["in_sync"] is True
    fleet_args: dict[str, Any] = {"name": "fleet", "digest": FLEET, "roles": sorted(units), "env": env}
    fleet_args |= {"files": [], "trees": [], "commands": []}
    recorded = node.module(state="fleet_record", **fleet_args)
    assert recorded["in_sync"] is True, recorded
    log.unlink()
    checked = node.module(state="fleet_check", **fleet_args)
    assert checked["in_sync"] is True, checked
    calls = log.read_text().splitlines()
    assert len(calls) == 1, calls
    assert calls[0].endswith("-- containerd.service docker.service ray.service"), calls


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the module as another user (setpriv)")
def test_a_stamp_a_login_cannot_read_says_to_become_root_not_to_check_the_disk(node: Node) -> None:
    """Before: "Permission denied … Fix: check the node's disk", for a sudo login whose play did not become
    root (the artifacts stage, before its plays had become: true)."""
    with tempfile.TemporaryDirectory() as shared:
        Path(shared).chmod(0o755)  # the arguments, readable by the login; the stamps stay root's
        arguments = Path(shared) / "args.json"
        params = {
            "name": "docker",
            "digest": DIGEST,
            "root": str(node.root / "stamps"),
            "files": [str(node.config)],
        }
        arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
        arguments.chmod(0o644)
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        done = subprocess.run(
            [*as_nobody, sys.executable, str(MODULE), str(arguments)],
            capture_output=True,
            text=True,
            check=False,
        )
    result = json.loads(done.stdout)
    assert result.get("failed") and "Permission denied" in result["msg"], result
    assert "become: true" in result["msg"] and "check the node's disk" not in result["msg"], result
