"""Images for upgrade and rollback on the lab: a second tag of the serving image, and one that exits at start.

Both are written here, on the control node, as one small ``docker save``-format archive that every host
loads: the head's raw image config of the serving image (read from dockerd's image store and checked
against its ID), changed into two new configs (one with a label more, one with a layer more that replaces
``vllm`` with a script that exits), the one new layer, and a manifest naming the base image's layers without
carrying them. ``docker load`` takes a layer it already has from its own store, so every host ends with the
same image IDs after moving kilobytes, and nothing reads the 2.8 GB base image (a ``docker build`` on the
head and a ``docker save`` of what it built did, about 40 s on an idle lab).
Used by tests/integration/test_e2e.py, tests/integration/test_services.py and benchmarks/upgrade.py.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import shlex
import subprocess
import tarfile
from typing import Any

from gpufleet.lab.core import Lab

UPGRADE_SUFFIX = "-2"  # a second tag: the same program, another image ID (a label differs)
BROKEN_SUFFIX = (
    "-broken"  # vLLM exits at start: what an image built for a newer driver looks like to gpufleet
)
BROKEN_MESSAGE = "gpufleet lab: this image exits at start"
UPGRADE_LABEL = ("org.gpufleet.lab.upgrade", "2")
VLLM = "opt/vllm/bin/vllm"  # the serving image's vllm command, which the broken image replaces

# Prints the image's ID, then its raw config exactly as dockerd stores it (the ID is that file's sha256).
_READ_CONFIG = (
    "set -e; id=$(docker image inspect --format '{{{{.Id}}}}' {image}); "
    "root=$(docker info --format '{{{{.DockerRootDir}}}}'); "
    "driver=$(docker info --format '{{{{.Driver}}}}'); "
    'echo "$id"; cat "$root/image/$driver/imagedb/content/sha256/${{id#sha256:}}"'
)


def _member(name: str, data: bytes | None, mode: int) -> tuple[tarfile.TarInfo, io.BytesIO | None]:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.uname, info.gname = mode, 946684800, "root", "root"  # 2000-01-01
    if data is None:
        info.type = tarfile.DIRTYPE
        return info, None
    info.size = len(data)
    return info, io.BytesIO(data)


def _tar(members: list[tuple[str, bytes | None, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, mode in members:
            tar.addfile(*_member(name, data, mode))
    return buffer.getvalue()


def broken_layer() -> bytes:
    """The broken image's one layer: ``vllm`` replaced by a script that prints :data:`BROKEN_MESSAGE`."""
    script = f"#!/bin/sh\necho {BROKEN_MESSAGE} >&2\nexit 1\n".encode()
    parents = ["opt", "opt/vllm", "opt/vllm/bin"]
    return _tar([*((folder, None, 0o755) for folder in parents), (VLLM, script, 0o755)])


def derived_archive(base: str, config: bytes) -> tuple[bytes, dict[str, str]]:
    """The archive of both images made from ``base`` (whose raw image config is ``config``), and tag -> ID."""
    parsed: dict[str, Any] = json.loads(config)
    layer = broken_layer()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()

    upgrade = copy.deepcopy(parsed)
    upgrade["config"]["Labels"] = dict(upgrade["config"].get("Labels") or {}) | dict([UPGRADE_LABEL])
    upgrade.setdefault("history", []).append(
        {"created": parsed["created"], "created_by": "LABEL " + "=".join(UPGRADE_LABEL), "empty_layer": True}
    )
    broken = copy.deepcopy(parsed)
    broken["rootfs"]["diff_ids"].append(diff_id)
    broken.setdefault("history", []).append(
        {"created": parsed["created"], "created_by": "gpufleet lab: " + VLLM}
    )

    members: list[tuple[str, bytes | None, int]] = [(f"{diff_id[7:]}/layer.tar", layer, 0o644)]
    manifest, ids = [], {base: "sha256:" + hashlib.sha256(config).hexdigest()}
    for tag, image in ((base + UPGRADE_SUFFIX, upgrade), (base + BROKEN_SUFFIX, broken)):
        blob = json.dumps(image, sort_keys=True, separators=(",", ":")).encode()
        digest = hashlib.sha256(blob).hexdigest()
        members.append((f"{digest}.json", blob, 0o644))
        layers = [f"{diff[7:]}/layer.tar" for diff in image["rootfs"]["diff_ids"]]  # the base's: not carried
        manifest.append({"Config": f"{digest}.json", "RepoTags": [tag], "Layers": layers})
        ids[tag] = "sha256:" + digest
    members.append(("manifest.json", json.dumps(manifest).encode(), 0o644))
    return _tar(members), ids


def image_id(lab: Lab, host: str, image: str) -> str:
    return lab.ssh(host, ["docker", "image", "inspect", "--format", "{{.Id}}", image]).stdout.strip()


def make_images(lab: Lab, base: str) -> dict[str, str]:
    """Make the upgrade and broken images of ``base`` on every host: tag -> image ID (``base`` included), the
    same on every host. RuntimeError says which host failed and why."""
    hosts = [host.hostname for host in lab.state().hosts]
    head = hosts[0]
    read = lab.ssh(head, ["bash", "-c", _READ_CONFIG.format(image=shlex.quote(base))])
    base_id, _, config = read.stdout.partition("\n")
    if read.returncode != 0 or "sha256:" + hashlib.sha256(config.encode()).hexdigest() != base_id:
        raise RuntimeError(
            f"{head}: reading the image config of {base} failed: {read.stderr or read.stdout[:300]}"
        )
    archive, ids = derived_archive(base, config.encode())
    for host in hosts:
        loaded = subprocess.run(
            [*lab.ssh_argv(host), "docker load"], input=archive, capture_output=True, timeout=600, check=False
        )
        if loaded.returncode != 0:
            raise RuntimeError(f"{host}: docker load of the upgrade images failed: {loaded.stderr.decode()}")
        theirs = {tag: image_id(lab, host, tag) for tag in ids}
        if theirs != ids:
            raise RuntimeError(f"{host}: image IDs {theirs}, expected {ids}")
    return ids
