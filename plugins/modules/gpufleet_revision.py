#!/usr/bin/python
"""Ansible module: keep the last healthy revisions of a node's service, and bring one back.

A revision is what a node ran when the service last passed its health gate: the rendered configuration and
units (their bytes and modes, or that they were absent), the image the Ray container ran (by ID, kept from
deletion by a ``gpufleet/revision:<slot>`` tag) and the model directory (its marker's commit, kept as hard
links beside it: no second copy of the weights, and the model stage's atomic renames leave the kept links
intact). Two slots: ``current`` (the last healthy revision) and ``previous`` (the one before). ``record``
after a passed gate moves ``current`` to ``previous`` only when what runs differs; ``restore`` puts a slot's
files, model and image back and says what it changed. A file the current revision or ``files`` lists and the
restored one does not know is removed: restoring a revision of another file layout (the one before vLLM
instances) puts that layout back whole, not beside the current one.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpufleet_revision
author: gpufleet maintainers (@gpufleet)
short_description: Record the healthy revision of a node's service, or restore a recorded one
description:
  - Keeps two revisions per node under I(root) (current, previous), each the listed files, the image ID
    the container runs and the model directory at its commit; restores one of them.
  - Used by the gpufleet.gpufleet.vllm_service role (revision_record.yml, revision_restore.yml).
options:
  state:
    {type: str, default: read, choices: [read, record, restore, absent], description: "read: report both
    slots; record: make what runs now the current revision (the current one becomes previous) unless it
    already is; restore: put slot's files, model directory and image back; absent: forget both slots (an
    instance removed from the node) with their kept model links."}
  root: {type: path, default: /var/lib/gpufleet/revisions, description: Where the revisions are kept.}
  files:
    {type: list, elements: path, default: [], description: "The files of the service (absent ones too); with
    state=restore, those the kept revision does not know are removed."}
  container: {type: str, default: gpufleet-ray, description: The container whose image ID is recorded.}
  image_name: {type: str, default: "", description: The image reference the inventory names (for the report).}
  unit: {type: str, default: "", description: "The unit that runs the service (kept with the revision)."}
  model_dir: {type: path, default: "", description: The model directory (empty when the node has none).}
  gate:
    {type: dict, default: {}, description: "What the health gate asks (url, served model), kept as given."}
  fleet:
    {type: str, default: "", description: "With state=record: the fleet revision (one ID for every node's
    state; empty = this node's own). A node records when its current revision has another one, so every
    node rotates when any node changed."}
  slot: {type: str, default: current, choices: [current, previous], description: With state=restore.}
  keep_owner:
    type: str
    default: ""
    description:
      - State record. Names the model's kept links (C(<dir>@OWNER@current)) for an instance that shares
        the model directory with others on the node (replicas of services), so that one's rotation never
        moves another's, and its image tags (C(gpufleet/revision:OWNER-current), C(OWNER-previous)), as the
        replicas of a node may run different images.
  docker: {type: str, default: docker, description: The docker CLI.}
"""

EXAMPLES = r"""
- name: Record the healthy revision
  gpufleet.gpufleet.gpufleet_revision:
    state: record
    root: /var/lib/gpufleet/revisions/default
    files: [/etc/gpufleet/instances/default/vllm.yaml, /etc/systemd/system/gpufleet-vllm@.service]
    unit: gpufleet-vllm@default.service
    model_dir: /opt/models/Qwen2.5-1.5B-Instruct
"""

RETURN = r"""
revisions:
  description: Each slot's summary (id, created, image, model, gate, unit), or null.
  returned: always
  type: dict
restored:
  description: With state=restore, the files put back (or removed) and whether the model directory was.
  returned: always
  type: list
  elements: str
"""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING, Any

from ansible.module_utils.basic import AnsibleModule

if TYPE_CHECKING:  # annotations only: never evaluated on the node, whatever its Python
    from collections.abc import Mapping

# Shared host-side code: plugins/module_utils (docs/conventions.md, Python layout, says why in this shape)
if TYPE_CHECKING:  # mypy reads the repository's
    from plugins.module_utils.gpufleet_files import read_model_marker, sha256
else:
    try:  # a checkout or the wheel: ansible.cfg's module_utils path, beside library
        from ansible.module_utils.gpufleet_files import read_model_marker, sha256
    except ImportError:  # the installed collection
        from ansible_collections.gpufleet.gpufleet.plugins.module_utils.gpufleet_files import (
            read_model_marker,
            sha256,
        )

SLOTS = ("current", "previous")
RECORD = "revision.json"
IMAGE_TAG = "gpufleet/revision"


class RevisionError(Exception):
    """A problem the caller reports as the task's failure."""


def file_state(path: str) -> dict[str, Any] | None:
    """sha256 and mode of a regular file, None when it is absent."""
    if not os.path.isfile(path):
        return None
    return {"sha256": sha256(path), "mode": f"{os.stat(path).st_mode & 0o7777:04o}"}


def model_revision(model_dir: str) -> str:
    """The commit the model directory's marker names; empty without a readable marker."""
    marker = read_model_marker(model_dir)
    return "" if marker is None else str(marker.get("revision", ""))


def keep_dir(model_dir: str, slot: str, owner: str = "") -> str:
    """Beside the model directory, on its file system (hard links do not cross file systems); ``owner`` (an
    instance that shares the model directory with others on the node) gets links of its own."""
    parent, name = os.path.split(model_dir.rstrip("/"))
    return os.path.join(parent, ".gpufleet-revisions", f"{name}@{owner + '@' if owner else ''}{slot}")


def docker(cli: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cli, *args], capture_output=True, text=True, check=False)


def live(params: Mapping[str, Any]) -> dict[str, Any]:
    """What the node runs now: files, the container's image ID, the model's commit; and its fingerprint."""
    inspected = docker(params["docker"], "inspect", "--format", "{{.Image}}", params["container"])
    if inspected.returncode != 0:
        raise RevisionError(
            f"container {params['container']} is not there ({inspected.stderr.strip()}), so there is no "
            "running revision to record. Fix: deploy the cluster and serve stages first."
        )
    files = {path: file_state(path) for path in params["files"]}
    model = None
    if params["model_dir"]:
        model = {"dir": params["model_dir"].rstrip("/"), "revision": model_revision(params["model_dir"])}
    state = {"files": files, "image_id": inspected.stdout.strip(), "model": model}
    fingerprint = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
    return {**state, "id": fingerprint[:12], "fingerprint": fingerprint}


def read(root: str, slot: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(root, slot, RECORD)) as src:
            record: dict[str, Any] = json.load(src)
            return record
    except (OSError, ValueError):
        return None


def summary(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    keys = ("id", "fleet", "created", "image_name", "image_id", "model", "gate", "unit")
    return {key: record.get(key) for key in keys}


def link_tree(source: str, target: str) -> None:
    """target: a copy of source made of hard links (directories are new, files share their inodes)."""
    for folder, dirs, names in os.walk(source):
        rel = os.path.relpath(folder, source)
        os.makedirs(os.path.join(target, rel), exist_ok=True)
        for name in names:
            src = os.path.join(folder, name)
            if os.path.islink(src) or not os.path.isfile(src):
                continue
            os.link(src, os.path.join(target, rel, name))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]


def write_file(source: str, path: str, mode: str) -> None:
    """Atomic: a temporary file in the target's directory (0600 from the start: it may carry the API key),
    renamed over it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.gpufleet-restore"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out, open(source, "rb") as src:
        shutil.copyfileobj(src, out)
    os.chmod(temporary, int(mode, 8))
    os.replace(temporary, path)


def build(now: dict[str, Any], staging: str, owner: str = "") -> list[str]:
    """The new slot's files under ``staging`` and its model's hard links under its temporary name."""
    shutil.rmtree(staging, ignore_errors=True)
    for path, state in now["files"].items():
        if state is not None:
            kept = os.path.join(staging, "files", path.lstrip("/"))
            os.makedirs(os.path.dirname(kept), mode=0o700, exist_ok=True)
            shutil.copyfile(path, kept)
            os.chmod(kept, 0o600)  # the environment files carry the API key
    if now["model"] is None:
        return []
    incoming = keep_dir(now["model"]["dir"], "current.new", owner)
    shutil.rmtree(incoming, ignore_errors=True)
    now["model"]["keep"] = keep_dir(now["model"]["dir"], "current", owner)
    if os.path.isdir(now["model"]["dir"]):
        try:
            link_tree(now["model"]["dir"], incoming)
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
            shutil.rmtree(incoming, ignore_errors=True)
            now["model"]["keep"] = ""
            return [
                f"{now['model']['dir']} is a mount point: its files cannot be kept as hard links beside it, "
                "so a rollback across a model change needs that model fetched again"
            ]
    return []


def rotate(root: str, current: dict[str, Any], cli: str, owner: str = "") -> None:
    """current -> previous (its model's links and image tag too); the old previous goes."""
    old = read(root, "previous")
    if old is not None and (old.get("model") or {}).get("keep"):
        shutil.rmtree(old["model"]["keep"], ignore_errors=True)
    shutil.rmtree(os.path.join(root, "previous"), ignore_errors=True)
    if (current.get("model") or {}).get("keep"):
        kept = keep_dir(current["model"]["dir"], "previous", owner)
        shutil.rmtree(kept, ignore_errors=True)
        if os.path.isdir(current["model"]["keep"]):
            os.replace(current["model"]["keep"], kept)
        current["model"]["keep"] = kept
    current["slot"] = "previous"
    os.replace(os.path.join(root, "current"), os.path.join(root, "previous"))
    write_record(os.path.join(root, "previous"), current)
    tag(cli, current["image_id"], "previous", owner)


def record(module: AnsibleModule) -> dict[str, Any]:
    """Make what runs the current revision of fleet revision ``fleet`` (the current one becomes previous).

    The fleet revision is one ID for every node's state (playbooks compute it from each node's fingerprint):
    when any node changed, every node rotates, so ``previous`` is the same change on every node, also on
    one whose own files did not change. The new slot is built under temporary names first, then rotated
    in by renames, so a failure (a full disk) leaves the kept slots as they were."""
    params, root = module.params, module.params["root"]
    try:
        now = live(params)
    except RevisionError:
        if module.check_mode:  # a fresh fleet in check mode: nothing runs yet, a real run records it
            return {"changed": True}
        raise
    fleet = params["fleet"] or now["fingerprint"][:12]
    current = read(root, "current")
    if current is not None and current.get("fleet", current.get("id")) == fleet:
        return {"changed": False}
    if module.check_mode:
        return {"changed": True}
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.chmod(root, 0o700)
    staging = os.path.join(root, "current.new")
    warnings = build(now, staging, params["keep_owner"])
    now.update(
        slot="current",
        fleet=fleet,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        image_name=params["image_name"],
        gate=params["gate"],
        unit=params["unit"],
    )
    write_record(staging, now)
    if current is not None:  # everything is built: rotate by renames (current -> previous, new -> current)
        rotate(root, current, params["docker"], params["keep_owner"])
    if now["model"] is not None and now["model"]["keep"]:
        shutil.rmtree(now["model"]["keep"], ignore_errors=True)
        incoming = keep_dir(now["model"]["dir"], "current.new", params["keep_owner"])
        if os.path.isdir(incoming):
            os.replace(incoming, now["model"]["keep"])
    shutil.rmtree(os.path.join(root, "current"), ignore_errors=True)
    os.replace(staging, os.path.join(root, "current"))
    tag(params["docker"], now["image_id"], "current", params["keep_owner"])
    return {"changed": True, "warnings": warnings}


def write_record(folder: str, data: Mapping[str, Any]) -> None:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    with open(os.path.join(folder, RECORD + ".tmp"), "w") as out:
        json.dump(data, out, indent=1, sort_keys=True)
    os.replace(os.path.join(folder, RECORD + ".tmp"), os.path.join(folder, RECORD))


def tag(cli: str, image_id: str, slot: str, owner: str = "") -> None:
    """Keep the slot's image from deletion: ``gpufleet/revision:SLOT`` (instance default), or
    ``gpufleet/revision:OWNER-SLOT`` for the other instances (replicas of a node may run different images)."""
    name = f"{IMAGE_TAG}:{owner + '-' if owner else ''}{slot}"
    done = docker(cli, "tag", image_id, name)
    if done.returncode != 0:
        raise RevisionError(f"docker tag {image_id} {name}: {done.stderr.strip()}")


def wanted_files(
    kept: Mapping[str, Any], current: Mapping[str, Any] | None, layout: list[str]
) -> dict[str, Any]:
    """Each file's state the kept revision wants: its own files, and absent for every file the current
    revision or the role's layout (``files``) has that the kept revision does not know."""
    wanted = dict(kept["files"])
    for path in [*(current or {}).get("files", {}), *layout]:
        wanted.setdefault(path, None)
    return wanted


def restore(module: AnsibleModule) -> dict[str, Any]:
    params, root, slot = module.params, module.params["root"], module.params["slot"]
    kept = read(root, slot)
    if kept is None:
        raise RevisionError(
            f"no {slot} revision in {root}: one is recorded each time a deploy passes its health gate "
            "(the verify stage)"
            + (", and previous only after a second, different healthy deploy" if slot == "previous" else "")
            + ". Nothing was changed."
        )
    if docker(params["docker"], "image", "inspect", kept["image_id"]).returncode != 0:
        raise RevisionError(
            f"the {slot} revision's image {kept['image_id']} ({kept.get('image_name') or 'no name'}) is no "
            f"longer on this node (removed although tagged {IMAGE_TAG}:{slot}). Nothing was changed. Fix: "
            "load that image again (docker load from the bundle that brought it), then run again."
        )
    model: dict[str, str] = kept.get("model") or {}
    model_back = bool(model) and model_revision(model["dir"]) != model["revision"]
    if model_back and not os.path.isdir(model["keep"]):
        raise RevisionError(
            f"{model['dir']} holds another commit than the {slot} revision's {model['revision'] or '(none)'} "
            f"and the kept copy {model['keep']} is gone. Nothing was changed. Fix: fetch that commit again "
            "(gpufleet deploy --stages artifacts with the bundle that brought it)."
        )
    wanted = wanted_files(kept, read(root, "current"), params["files"])
    changes = [path for path, state in wanted.items() if file_state(path) != state]
    lost = [
        path
        for path in changes
        if wanted[path] is not None
        and file_state(os.path.join(root, slot, "files", path.lstrip("/"))) is None
    ]
    if lost:
        raise RevisionError(
            f"the {slot} revision in {root} lacks its copy of {', '.join(lost)}. Nothing was changed. "
            "Fix: deploy the wanted settings again (gpufleet deploy)."
        )
    restored = [f"{path} ({'removed' if wanted[path] is None else 'restored'})" for path in changes]
    if model_back:
        restored.append(f"{model['dir']} (model at {model['revision'][:12] or 'its kept files'})")
    if module.check_mode or not restored:
        return {"changed": bool(restored), "restored": restored, "revision": summary(kept)}
    if model_back:
        incoming, outgoing = model["dir"] + ".gpufleet-restore", model["dir"] + ".gpufleet-replaced"
        for folder in (incoming, outgoing):
            shutil.rmtree(folder, ignore_errors=True)
        link_tree(model["keep"], incoming)
        if os.path.isdir(model["dir"]):
            os.replace(model["dir"], outgoing)
        os.replace(incoming, model["dir"])
        shutil.rmtree(outgoing, ignore_errors=True)
    for path in changes:
        state = wanted[path]
        if state is None:
            os.unlink(path)
        else:
            write_file(os.path.join(root, slot, "files", path.lstrip("/")), path, state["mode"])
    return {"changed": True, "restored": restored, "revision": summary(kept)}


def forget(root: str, check: bool) -> dict[str, Any]:
    """Both slots gone, with their model links (the image tags stay: other instances share them)."""
    if not os.path.isdir(root):
        return {"changed": False}
    if not check:
        for slot in SLOTS:
            kept = read(root, slot)
            if kept is not None and (kept.get("model") or {}).get("keep"):
                shutil.rmtree(kept["model"]["keep"], ignore_errors=True)
        shutil.rmtree(root)
    return {"changed": True}


def run(module: AnsibleModule) -> dict[str, Any]:
    state, root = module.params["state"], module.params["root"]
    result: dict[str, Any] = {"changed": False, "restored": []}
    if state == "read" and module.params["files"]:  # what runs now, for the fleet revision's ID
        try:
            result["fingerprint"] = live(module.params)["fingerprint"]
        except RevisionError as missing:
            result["fingerprint"], result["why"] = "", str(missing)
    if state == "record":
        result.update(record(module))
    elif state == "restore":
        result.update(restore(module))
    elif state == "absent":
        result.update(forget(root, module.check_mode))
    result["revisions"] = {slot: summary(read(root, slot)) for slot in SLOTS}
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "default": "read", "choices": ["read", "record", "restore", "absent"]},
            "root": {"type": "path", "default": "/var/lib/gpufleet/revisions"},
            "files": {"type": "list", "elements": "path", "default": []},
            "container": {"type": "str", "default": "gpufleet-ray"},
            "image_name": {"type": "str", "default": ""},
            "unit": {"type": "str", "default": ""},
            "model_dir": {"type": "path", "default": ""},
            "gate": {"type": "dict", "default": {}},
            "fleet": {"type": "str", "default": ""},
            "keep_owner": {"type": "str", "default": ""},
            "slot": {"type": "str", "default": "current", "choices": ["current", "previous"]},
            "docker": {"type": "str", "default": "docker"},
        },
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except RevisionError as problem:
        module.fail_json(msg=f"{os.uname().nodename}: {problem}")
    except OSError as problem:
        module.fail_json(msg=f"{os.uname().nodename}: {problem}. Fix: check the node's disk, then run again.")


if __name__ == "__main__":
    main()
