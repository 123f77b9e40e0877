#!/usr/bin/python
"""Ansible module: check (and record) the model directory of one node.

The marker file ``.gpufleet-model.json`` in the model directory says what is there: repo, revision and
every file with size and sha256. It is written only after every file matched, and removed before any
file is touched, so a partial or corrupt model is never taken for a good one. A file that is not on the
list (an injected ``*.safetensors``), a missing or changed one, a symlink or a special file makes the
directory not good, so it is fetched again and repaired (``prune``), never trusted. ``promote`` moves a
received copy from its staging directory into place only after every file in it matched.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpufleet_model_check
author: gpufleet maintainers (@gpufleet)
short_description: Verify a model directory against a file list (or its git-lfs checkout) and keep a marker
description:
  - Checks every file of a model directory by size and sha256 (or its git blob), against the list it is
    given or the git-lfs checkout at HEAD, and keeps a marker file (.gpufleet-model.json) that is written only
    after every file matched and removed before any file is touched.
  - Used by the gpufleet.gpufleet.model_fetch role on every node.
options:
  path: {type: path, required: true, description: The model directory.}
  repo: {type: str, required: true, description: ModelScope repository id.}
  revision: {type: str, default: "", description: Expected commit; empty accepts the marker's.}
  files: {type: dict, default: {}, description: "Expected files: relative path -> {sha256, size}."}
  from_git:
    {type: bool, default: false, description: Take the expected files from the git-lfs checkout at HEAD.}
  verify: {type: str, default: sha256, choices: [sha256, size], description: How deeply to check files.}
  state:
    {type: str, default: check, choices: [check, record, promote, invalidate], description: "check: report
    only; record: check and write the marker when all is well; promote: check the staging directory, then move
    its files into place, remove every other file and write the marker; invalidate: remove the marker."}
  staging:
    {type: path, default: "", description: "With state=promote: the directory a copy was received into."}
  prune:
    {type: bool, default: false, description: "With state=record: first remove files that are not expected."}
  dedupe_lfs: {type: bool, default: false, description: Hard-link .git/lfs/objects to the checked-out files.}
"""

EXAMPLES = r"""
- name: Check the model directory against the bundle's file list
  gpufleet.gpufleet.gpufleet_model_check:
    path: /opt/models/Qwen2.5-1.5B-Instruct
    repo: Qwen/Qwen2.5-1.5B-Instruct
    files: "{{ __model_fetch_files }}"
    state: record
"""

RETURN = r"""
ok:
  description: Every file matched (and, with state=record, the marker says so).
  returned: always
  type: bool
problems:
  description: One line per missing, extra or changed file, symlink or special file.
  returned: always
  type: list
  elements: str
revision:
  description: The commit the directory holds.
  returned: always
  type: str
files:
  description: Every file with its size and sha256 (or git blob).
  returned: always
  type: dict
removed:
  description: Files removed because the list does not name them (prune, promote).
  returned: always
  type: list
  elements: str
"""

import os
import shutil
import stat
import subprocess
from typing import TYPE_CHECKING, Any

from ansible.module_utils.basic import AnsibleModule

if TYPE_CHECKING:  # annotations only: never evaluated on the node, whatever its Python
    from collections.abc import Mapping

    # One expected or recorded file: {"sha256", "size"}, or {"git_blob", "size"} for a file git stores
    # itself. Plain dicts: they come from the module's parameters and go back as JSON.
    FileEntry = dict[str, Any]

# Shared host-side code: plugins/module_utils (docs/conventions.md, Python layout, says why in this shape)
if TYPE_CHECKING:  # mypy reads the repository's
    from plugins.module_utils.gpufleet_files import (
        MODEL_MARKER,
        read_model_marker,
        sha256,
        write_model_marker,
    )
else:
    try:  # a checkout or the wheel: ansible.cfg's module_utils path, beside library
        from ansible.module_utils.gpufleet_files import (
            MODEL_MARKER,
            read_model_marker,
            sha256,
            write_model_marker,
        )
    except ImportError:  # the installed collection
        from ansible_collections.gpufleet.gpufleet.plugins.module_utils.gpufleet_files import (
            MODEL_MARKER,
            read_model_marker,
            sha256,
            write_model_marker,
        )


def git(path: str, *args: str) -> str:
    return subprocess.run(["git", "-C", path, *args], capture_output=True, text=True, check=True).stdout


def files_from_git(path: str) -> dict[str, FileEntry]:
    """Expected files of a git-lfs checkout: LFS files by their pointer, others by the blob in HEAD."""
    expected: dict[str, FileEntry] = {}
    lfs: dict[str, str] = {}
    for line in git(path, "lfs", "ls-files", "--long").splitlines():
        oid, _marker, name = line.split(" ", 2)
        lfs[name] = oid
    for line in git(path, "ls-tree", "-r", "-l", "HEAD").splitlines():
        meta, name = line.split("\t", 1)
        _mode, _kind, blob, size = meta.split()
        if name in lfs:
            pointer = git(path, "cat-file", "blob", blob)
            lfs_size = next(int(p.split()[1]) for p in pointer.splitlines() if p.startswith("size "))
            expected[name] = {"sha256": lfs[name], "size": lfs_size}
        else:
            expected[name] = {"git_blob": blob, "size": int(size)}
    return expected


def present_files(path: str) -> tuple[set[str], list[str]]:
    """Every regular file under path (relative; not .git, not the marker), and what is not file nor dir."""
    files: set[str] = set()
    odd: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        here = os.path.relpath(dirpath, path)
        for name in list(dirnames):
            if (here == "." and name == ".git") or os.path.islink(os.path.join(dirpath, name)):
                dirnames.remove(name)
                if name != ".git" or here != ".":
                    odd.append(os.path.normpath(os.path.join(here, name)))
        for name in filenames:
            rel = os.path.normpath(os.path.join(here, name))
            if rel != MODEL_MARKER:
                mode = os.lstat(os.path.join(dirpath, name)).st_mode
                (files.add(rel) if stat.S_ISREG(mode) else odd.append(rel))
    return files, sorted(odd)


def strangers(path: str, files: Mapping[str, Any]) -> list[str]:
    """One line per file the list does not name, and per symlink or special file."""
    present, odd = present_files(path)
    lines = [
        f"{name}: extra file, not in the expected list (injected or stale)"
        for name in sorted(present - set(files))
    ]
    return lines + [f"{name}: a symlink or special file, expected regular files only" for name in odd]


def prune(path: str, files: Mapping[str, Any]) -> list[str]:
    """Remove every file, symlink and special file the list does not name (a symlinked directory too)."""
    present, odd = present_files(path)
    removed = sorted(present - set(files)) + odd
    for name in removed:
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        else:
            os.unlink(full)
    return removed


def check_file(path: str, name: str, want: Mapping[str, Any], verify: str) -> tuple[str | None, str | None]:
    full = os.path.join(path, name)
    if os.path.islink(full) or not os.path.isfile(full):
        return f"{name}: {'a symlink, expected a regular file' if os.path.islink(full) else 'missing'}", None
    size = os.path.getsize(full)
    if size != want["size"]:
        return f"{name}: size {size}, expected {want['size']} (partial or corrupt)", None
    if verify == "size" and "sha256" in want:
        return None, want["sha256"]
    digest = sha256(full)
    if "git_blob" in want:
        blob = git(path, "hash-object", "--no-filters", full).strip()
        return (None if blob == want["git_blob"] else f"{name}: content differs from git"), digest
    if digest != want["sha256"]:
        return f"{name}: sha256 {digest[:12]}..., expected {want['sha256'][:12]}...", digest
    return None, digest


def dedupe(path: str, files: Mapping[str, FileEntry]) -> int:
    """One copy of each weight on disk: the LFS object becomes a hard link of the checked-out file."""
    linked = 0
    for name, entry in files.items():
        oid = entry["sha256"]
        obj = os.path.join(path, ".git", "lfs", "objects", oid[:2], oid[2:4], oid)
        full = os.path.join(path, name)
        if os.path.isfile(obj) and not os.path.samefile(obj, full):
            tmp = obj + ".link"
            os.link(full, tmp)
            os.replace(tmp, obj)
            linked += 1
    for leftover in ("incomplete", "tmp"):
        base = os.path.join(path, ".git", "lfs", leftover)
        for stale in os.listdir(base) if os.path.isdir(base) else []:
            os.unlink(os.path.join(base, stale))
    return linked


def expected_files(module: AnsibleModule, path: str) -> tuple[dict[str, FileEntry], str]:
    params = module.params
    if params["from_git"]:
        try:
            return files_from_git(path), git(path, "rev-parse", "HEAD").strip()
        except (subprocess.CalledProcessError, OSError) as exc:
            module.fail_json(msg=f"{path}: not a readable git-lfs checkout ({exc}). Fix: run the role again.")
    if params["files"]:
        return params["files"], params["revision"]
    marker = read_model_marker(path) or {}
    return marker.get("files", {}), marker.get("revision", "")


def run(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    path, marker_path = params["path"], os.path.join(params["path"], MODEL_MARKER)
    if params["state"] == "invalidate":
        present = os.path.exists(marker_path)
        if present and not module.check_mode:
            os.unlink(marker_path)
        return {"changed": present, "ok": False, "removed": []}
    if params["state"] == "promote":
        return promote(module)
    listed = expected_files(module, path)[0] if params["prune"] else {}
    removed = prune(path, listed) if listed and not module.check_mode else []  # no list: never prune all
    marker = read_model_marker(path)
    files, revision = expected_files(module, path)
    problems: list[str] = []
    if params["revision"] and revision != params["revision"]:
        problems.append(f"revision {revision or 'unknown'}, expected {params['revision']}")
    if not files:
        problems.append("no file list (no marker and nothing expected)")
    recorded: dict[str, FileEntry] = {}
    for name, want in sorted(files.items()):
        problem, digest = check_file(path, name, want, params["verify"])
        if problem:
            problems.append(problem)
        recorded[name] = {"sha256": digest or want.get("sha256"), "size": want["size"]}
    if files:
        problems += strangers(path, files)
    wanted = {"repo": params["repo"], "revision": revision, "files": recorded}
    result: dict[str, Any] = {
        "changed": bool(removed),
        "removed": removed,
        "ok": not problems,
        "problems": problems,
        "revision": revision,
        "files": recorded,
    }
    if not problems and marker is not None and marker.get("repo") != params["repo"]:
        wrong_repo = f"marker names repo {marker.get('repo')}, expected {params['repo']}"
        result.update(ok=False, problems=[wrong_repo])
    if params["state"] == "record" and result["ok"] and marker != wanted:
        result["changed"] = True
        if not module.check_mode:
            write_model_marker(path, wanted)
    if params["dedupe_lfs"] and result["ok"] and not module.check_mode:
        result["changed"] = dedupe(path, recorded) > 0 or result["changed"]
    result["recorded"] = result["ok"] and (marker == wanted or params["state"] == "record")
    return result


def promote(module: AnsibleModule) -> dict[str, Any]:
    """Check the staging copy against the list; only then move it into place, prune the rest, mark it."""
    params = module.params
    path, staging, files = params["path"], params["staging"], params["files"]
    if not staging or not files:
        module.fail_json(msg="state=promote needs staging and files (the expected list)")
    problems = [] if os.path.isdir(staging) else [f"{staging}: no received copy"]
    if not problems:
        problems += [f"{p} (in {staging})" for p in strangers(staging, files)]
        for name, want in sorted(files.items()):
            problem, _digest = check_file(staging, name, want, "sha256")
            if problem:
                problems.append(f"{problem} (in {staging})")
    result: dict[str, Any] = {"changed": False, "ok": not problems, "problems": problems, "files": files}
    result.update(revision=params["revision"], recorded=False, removed=[])
    if module.check_mode:
        return result
    if problems:  # nothing of it reaches the model directory
        shutil.rmtree(staging, ignore_errors=True)
        result["changed"] = True
        return result
    marker_path = os.path.join(path, MODEL_MARKER)
    if os.path.exists(marker_path):
        os.unlink(marker_path)
    os.makedirs(path, exist_ok=True)
    for name in sorted(files):
        target = os.path.join(path, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.islink(target) or os.path.isdir(target):
            (os.unlink if os.path.islink(target) else shutil.rmtree)(target)
        os.replace(os.path.join(staging, name), target)
    result["removed"] = prune(path, files)
    shutil.rmtree(staging, ignore_errors=True)
    write_model_marker(path, {"repo": params["repo"], "revision": params["revision"], "files": files})
    result.update(changed=True, recorded=True)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "repo": {"type": "str", "required": True},
            "revision": {"type": "str", "default": ""},
            "files": {"type": "dict", "default": {}},
            "from_git": {"type": "bool", "default": False},
            "verify": {"type": "str", "default": "sha256", "choices": ["sha256", "size"]},
            "state": {
                "type": "str",
                "default": "check",
                "choices": ["check", "record", "promote", "invalidate"],
            },
            "staging": {"type": "path", "default": ""},
            "prune": {"type": "bool", "default": False},
            "dedupe_lfs": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
