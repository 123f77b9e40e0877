"""gpufleet_revision (issue 14, upgrades and rollback): what a node keeps of its last two healthy revisions,
and how it puts one back. Run as Ansible runs it (a subprocess with its arguments file) on real files in a
temporary directory; the docker CLI is tests/doubles/docker-cli-double.sh (no dockerd on this machine; the
real CLI is exercised in the lab by tests/integration/test_e2e.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import module_env

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "plugins/modules/gpufleet_revision.py"
DOCKER = REPO / "tests/doubles/docker-cli-double.sh"
OLD, NEW = "sha256:" + "a" * 64, "sha256:" + "b" * 64


class Node:
    """A node's files, model directory and (through the docker double) images, under one tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.etc = root / "etc"
        self.etc.mkdir()
        self.model = root / "models" / "tiny"
        self.model.mkdir(parents=True)
        self.docker = root / "docker"
        self.docker.mkdir()
        self.files = [self.etc / "ray.env", self.etc / "vllm.yaml", self.etc / "firewall.service"]

    def runs(self, image: str, *, env: str, config: str, model_rev: str, weights: bytes) -> None:
        """What a deploy leaves: the rendered files, the container's image, the model (atomic renames)."""
        (self.docker / "container-image").write_text(image + "\n")
        with (self.docker / "images").open("a") as images:
            images.write(image + "\n")
        for path, text, mode in ((self.files[0], env, 0o600), (self.files[1], config, 0o644)):
            path.write_text(text)
            path.chmod(mode)
        for name, data in (
            ("model.safetensors", weights),
            (".gpufleet-model.json", json.dumps({"revision": model_rev}).encode()),
        ):
            staged = self.model / (name + ".tmp")
            staged.write_bytes(data)
            os.replace(staged, self.model / name)  # as model_fetch's copy and promote do

    def module(self, check: bool = False, **args: Any) -> dict[str, Any]:
        params = {
            "root": str(self.root / "revisions"),
            "files": [str(path) for path in self.files],
            "model_dir": str(self.model),
            "docker": str(DOCKER),
            "image_name": "vllm:1",
            **args,
        }
        if check:
            params["_ansible_check_mode"] = True
        arguments = self.root / "args.json"
        arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
        done = subprocess.run(
            [sys.executable, str(MODULE), str(arguments)],
            capture_output=True,
            text=True,
            check=False,
            env=module_env(self.root, DOCKER_DOUBLE_DIR=str(self.docker)),
        )
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def tags(self) -> list[str]:
        path = self.docker / "tags"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def node(tmp_path: Path) -> Node:
    node = Node(tmp_path)
    node.runs(OLD, env="IMAGE=1\n", config="max-model-len: 4096\n", model_rev="r1", weights=b"one")
    return node


def test_a_healthy_revision_is_recorded_once(node: Node) -> None:
    first = node.module(state="record", gate={"url": "http://10.0.0.11:8000", "served_model": "tiny"})
    second = node.module(state="record")

    assert first["changed"] and not second["changed"]  # a no-op re-run records nothing
    current = first["revisions"]["current"]
    assert current["image_id"] == OLD and current["model"]["revision"] == "r1"
    assert current["gate"] == {"url": "http://10.0.0.11:8000", "served_model": "tiny"}
    assert first["revisions"]["previous"] is None
    kept = node.root / "revisions/current/files" / str(node.files[0]).lstrip("/")
    assert kept.read_text() == "IMAGE=1\n" and kept.stat().st_mode & 0o777 == 0o600
    assert node.tags() == [f"{OLD} gpufleet/revision:current"]


def test_the_kept_model_is_hard_links_that_survive_the_next_fetch(node: Node) -> None:
    node.module(state="record")
    keep = node.model.parent / ".gpufleet-revisions" / "tiny@current" / "model.safetensors"
    assert keep.stat().st_ino == (node.model / "model.safetensors").stat().st_ino  # no second copy

    node.runs(NEW, env="IMAGE=2\n", config="max-model-len: 4096\n", model_rev="r2", weights=b"two")

    assert keep.read_bytes() == b"one"


def test_a_different_revision_moves_current_to_previous(node: Node) -> None:
    node.module(state="record")
    node.runs(NEW, env="IMAGE=2\n", config="max-model-len: 8192\n", model_rev="r2", weights=b"two")

    upgraded = node.module(state="record")

    assert upgraded["changed"]
    assert upgraded["revisions"]["current"]["image_id"] == NEW
    assert upgraded["revisions"]["previous"]["image_id"] == OLD
    assert upgraded["revisions"]["previous"]["model"]["keep"].endswith("tiny@previous")
    assert node.tags()[-2:] == [f"{OLD} gpufleet/revision:previous", f"{NEW} gpufleet/revision:current"]


def test_restoring_previous_puts_files_modes_and_model_back(node: Node) -> None:
    node.module(state="record")
    node.runs(NEW, env="IMAGE=2\n", config="max-model-len: 8192\n", model_rev="r2", weights=b"two")
    node.files[2].write_text("[Unit]\n")  # a file the old revision did not have
    node.module(state="record")
    node.files[0].chmod(0o644)

    restored = node.module(state="restore", slot="previous")

    assert restored["changed"]
    assert node.files[0].read_text() == "IMAGE=1\n" and node.files[0].stat().st_mode & 0o777 == 0o600
    assert node.files[1].read_text() == "max-model-len: 4096\n"
    assert not node.files[2].exists()
    assert (node.model / "model.safetensors").read_bytes() == b"one"
    assert json.loads((node.model / ".gpufleet-model.json").read_text())["revision"] == "r1"
    assert any("model at r1" in line for line in restored["restored"]), restored["restored"]
    assert node.module(state="restore", slot="previous")["changed"] is False  # in place now


def test_restoring_current_undoes_a_failed_change(node: Node) -> None:
    node.module(state="record")
    node.files[1].write_text("max-model-len: 999999\n")  # the change whose gate failed

    restored = node.module(state="restore", slot="current")

    assert restored["restored"] == [f"{node.files[1]} (restored)"]
    assert node.files[1].read_text() == "max-model-len: 4096\n"


def test_check_mode_says_what_it_would_restore_and_changes_nothing(node: Node) -> None:
    node.module(state="record")
    node.files[1].write_text("changed\n")

    would = node.module(check=True, state="restore", slot="current")

    assert would["changed"] and would["restored"] == [f"{node.files[1]} (restored)"]
    assert node.files[1].read_text() == "changed\n"


def test_a_missing_revision_is_refused_naming_what_records_one(node: Node) -> None:
    refused = node.module(state="restore", slot="previous")

    assert refused["failed"]
    assert "no previous revision" in refused["msg"] and "passes its health gate" in refused["msg"]
    assert "Nothing was changed" in refused["msg"]


def test_a_removed_image_is_refused_before_anything_changes(node: Node) -> None:
    node.module(state="record")
    node.files[1].write_text("changed\n")
    (node.docker / "images").write_text("")  # docker rmi of the kept image

    refused = node.module(state="restore", slot="current")

    assert refused["failed"] and f"image {OLD}" in refused["msg"] and "Fix: load that image" in refused["msg"]
    assert node.files[1].read_text() == "changed\n"


def test_nothing_running_is_refused_but_check_mode_on_a_fresh_node_passes(tmp_path: Path) -> None:
    fresh = Node(tmp_path)

    assert fresh.module(check=True, state="record")["changed"]
    refused = fresh.module(state="record")
    assert refused["failed"] and "is not there" in refused["msg"]


def test_a_change_on_another_node_rotates_this_one_too(node: Node) -> None:
    """One fleet revision for every node: a settings change on the head only (its vLLM files) must make the
    workers' previous the same change, or a rollback would put nodes on different images."""
    first = node.module(state="record", fleet="fleet-a")
    unchanged = node.module(state="record", fleet="fleet-a")
    rotated = node.module(state="record", fleet="fleet-b")  # another node changed; this one did not

    assert first["changed"] and not unchanged["changed"] and rotated["changed"]
    assert rotated["revisions"]["current"]["fleet"] == "fleet-b"
    assert rotated["revisions"]["previous"]["fleet"] == "fleet-a"
    assert rotated["revisions"]["previous"]["image_id"] == OLD == rotated["revisions"]["current"]["image_id"]
    assert node.module(state="restore", slot="previous")["restored"] == []  # the same files: nothing to do


def test_read_gives_the_fingerprint_of_what_runs(node: Node) -> None:
    before = node.module(state="read")["fingerprint"]
    node.files[1].write_text("max-model-len: 8192\n")

    assert node.module(state="read")["fingerprint"] not in ("", before)


def test_a_revision_of_another_file_layout_is_restored_whole(node: Node) -> None:
    """Issue 34 step 1: a revision kept before vLLM instances lists that release's files only; restoring it
    removes the files the current revision (or the role's layout) has and it does not know, so the two
    layouts never run side by side (two units enabled for one service)."""
    old_files = [str(path) for path in node.files]
    node.module(state="record", files=old_files)  # the release before: its own file list, no unit recorded
    instance = node.etc / "instances" / "default"
    instance.mkdir(parents=True)
    new_files = [str(node.files[0]), str(instance / "vllm.yaml"), str(node.etc / "vllm@.service")]
    node.files[1].rename(instance / "vllm.yaml")  # the migration: the config moves, a template unit appears
    (node.etc / "vllm@.service").write_text("[Unit]\n")
    (node.etc / "vllm.extra").write_text("a file of the layout no revision recorded yet\n")
    migrated = node.module(state="record", files=new_files, unit="vllm@default.service", fleet="f2")
    assert migrated["revisions"]["current"]["unit"] == "vllm@default.service"
    assert not migrated["revisions"]["previous"]["unit"]

    restored = node.module(state="restore", slot="previous", files=[*new_files, str(node.etc / "vllm.extra")])

    assert sorted(restored["restored"]) == sorted(
        [
            f"{node.files[1]} (restored)",
            f"{instance / 'vllm.yaml'} (removed)",
            f"{node.etc / 'vllm@.service'} (removed)",
            f"{node.etc / 'vllm.extra'} (removed)",
        ]
    )
    assert node.files[1].read_text() == "max-model-len: 4096\n"
    assert not (instance / "vllm.yaml").exists() and not (node.etc / "vllm@.service").exists()


def test_replicas_sharing_a_model_directory_keep_their_own_links(node: Node) -> None:
    """Two replicas on one node serve one model directory (services): each records under its own root with
    its own kept links (keep_owner), so the second one's rotation never moves or removes the first one's;
    after a model change both keep the old weights as previous and restore them."""
    roots = {owner: str(node.root / "revisions" / owner) for owner in ("tiny-0", "tiny-chat-0")}
    for owner, root in roots.items():
        node.module(state="record", root=root, keep_owner=owner, fleet="a")
    node.runs(NEW, env="IMAGE=2\n", config="max-model-len: 4096\n", model_rev="r2", weights=b"two")

    recorded = {o: node.module(state="record", root=r, keep_owner=o, fleet="b") for o, r in roots.items()}

    for owner, result in recorded.items():
        previous = result["revisions"]["previous"]["model"]
        assert previous["keep"].endswith(f"tiny@{owner}@previous"), previous
        assert (Path(previous["keep"]) / "model.safetensors").read_bytes() == b"one", owner
    restored = node.module(state="restore", slot="previous", root=roots["tiny-0"])
    assert restored["changed"] and (node.model / "model.safetensors").read_bytes() == b"one"


def test_absent_forgets_an_instances_revisions_and_its_kept_model_links(node: Node) -> None:
    """A replica removed from its node (fewer replicas): its revisions and its own kept model links go, the
    model directory and another replica's links stay."""
    roots = {owner: str(node.root / "revisions" / owner) for owner in ("tiny-1", "tiny-2")}
    for owner, root in roots.items():
        node.module(state="record", root=root, keep_owner=owner, fleet="a")
    node.runs(NEW, env="IMAGE=2\n", config="max-model-len: 4096\n", model_rev="r2", weights=b"two")
    for owner, root in roots.items():
        node.module(state="record", root=root, keep_owner=owner, fleet="b")
    kept = node.model.parent / ".gpufleet-revisions"

    assert node.module(state="absent", root=roots["tiny-2"], check=True)["changed"]
    assert Path(roots["tiny-2"]).is_dir()  # check mode: nothing removed
    gone = node.module(state="absent", root=roots["tiny-2"])

    assert gone["changed"] and gone["revisions"] == {"current": None, "previous": None}
    assert not Path(roots["tiny-2"]).exists()
    assert sorted(p.name for p in kept.iterdir()) == ["tiny@tiny-1@current", "tiny@tiny-1@previous"]
    assert (node.model / "model.safetensors").read_bytes() == b"two"
    assert node.module(state="absent", root=roots["tiny-2"])["changed"] is False


def test_a_replica_keeps_its_images_under_tags_of_its_own(node: Node) -> None:
    """The replicas of a node may run different images (a service's own): each keeps its slots' images under
    its own tags, so one replica's rotation never moves the tag that keeps another's image."""
    node.module(state="record", keep_owner="tiny-0")
    node.runs(NEW, env="IMAGE=2\n", config="max-model-len: 4096\n", model_rev="r1", weights=b"one")
    node.module(state="record", keep_owner="tiny-0")

    assert node.tags() == [
        f"{OLD} gpufleet/revision:tiny-0-current",
        f"{OLD} gpufleet/revision:tiny-0-previous",
        f"{NEW} gpufleet/revision:tiny-0-current",
    ]
