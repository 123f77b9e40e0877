#!/usr/bin/python
"""Ansible module: tell whether a role's last converge on this node still holds (the fast no-op re-run).

A role that converged records a stamp: the digest of its inputs (computed on the control node by the
``gpufleet_inputs`` lookup: the role's own files and every variable it reads) and a fingerprint of the node
state it manages (each file's and tree's metadata, each unit's states, the output of read-only commands
such as the image IDs docker holds). On the next run ``check`` compares both in one module call; when
nothing differs the role skips its converge tasks, so a re-run that changes nothing costs one task per role
instead of dozens. Anything that differs (an input, an edited or replaced file, a stopped unit, a removed
image) makes the role converge in full, as on its first run. A stamp that no longer holds is removed at
once, so a converge that then fails can never leave a stale stamp behind that a later run would trust.

A whole deploy adds one stamp above the roles' (``fleet``, playbooks/fleet_check.yml and fleet_record.yml):
``fleet_record`` names the role stamps a deploy left and their digests; ``fleet_check`` compares the
deployment's inputs digest and, from the specs the role stamps keep, every role's node state in one call, so a
re-run that changes nothing costs one task per node for all its roles.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpufleet_converged
author: gpufleet maintainers (@gpufleet)
short_description: Record, or check, that a role's last converge on this node still holds
description:
  - With I(state=check), compares the role's inputs digest and the node state it manages (files, trees,
    systemd units, read-only commands) with the stamp its last successful converge recorded, and reports
    I(in_sync). When in sync, returns the facts recorded with the stamp as ansible_facts.
  - With I(state=record), writes the stamp (mode 0600) from the node state now.
  - With I(state=fleet_record), writes the fleet stamp I(name), with the digests of the role stamps named by
    I(roles) (all must exist) with this module's own node state; I(state=fleet_check) compares it, each of
    those role stamps' digests and each role's node state (from the specs the role stamps keep) in one call.
  - Files are compared by metadata (type, size, modification time, inode, mode, owner), which any edit,
    replacement, chmod or chown changes; a tree is every entry below it, compared the same way.
  - Used by every gpufleet.gpufleet role that converges a node.
options:
  name: {type: str, required: true, description: "The stamp's name, the role's (one stamp per role)."}
  state:
    type: str
    default: check
    choices: [check, record, fleet_check, fleet_record]
    description: "check: compare, report, and remove a stamp that no longer holds (not in check mode);
      record: write the stamp (not in check mode); fleet_check, fleet_record: the same for the fleet stamp
      over I(roles)."
  roles:
    {type: list, elements: str, default: [], description: "With fleet_check and fleet_record: the role stamps
    the fleet stamp covers."}
  digest: {type: str, required: true, description: "The role's inputs digest (lookup gpufleet_inputs)."}
  files: {type: list, elements: path, default: [], description: Files and directories (not their contents).}
  trees: {type: list, elements: path, default: [], description: Directories compared with every entry below.}
  units: {type: list, elements: str, default: [], description: "systemd units: load, active, file states."}
  commands:
    {type: list, elements: list, default: [], description: "Read-only commands (argv lists); their exit
    status and output are part of the node state."}
  facts:
    {type: dict, default: {}, description: "With state=record: facts later tasks need, returned as
    ansible_facts when a check finds the stamp in sync."}
  root: {type: path, default: /var/lib/gpufleet/converged, description: Where the stamps are kept.}
"""

EXAMPLES = r"""
- name: Ask the node whether the docker role's last converge still holds
  gpufleet.gpufleet.gpufleet_converged:
    name: docker
    digest: "{{ lookup('gpufleet.gpufleet.gpufleet_inputs', 'docker_') }}"
    files: [/etc/docker/daemon.json, /etc/systemd/system/docker.service]
    units: [containerd.service, docker.service]
  register: __docker_converged
  check_mode: false
"""

RETURN = r"""
in_sync:
  description: The stamp exists, its digest is I(digest) and the node state is the one it recorded.
  returned: always
  type: bool
why:
  description: What differs (the first difference found), or that it is in sync.
  returned: always
  type: str
  sample: /etc/docker/daemon.json changed since the last converge
digest:
  description: The digest checked, for the record that follows a converge (the inputs as the check saw them).
  returned: when not in sync
  type: str
"""

import hashlib
import json
import os
import stat
import subprocess
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: never evaluated on the node, whatever its Python
    from collections.abc import Iterable, Mapping

    from ansible.module_utils.basic import AnsibleModule

SCHEMA = 2  # 2: a role stamp keeps its spec (what it fingerprints), for the fleet check
SPEC = ("files", "trees", "units", "commands")
# A unit's invocation ID changes with every start: a service restarted since the converge (a crash, a restart
# of what it depends on) makes its role converge again, and so wait until the service is ready again.
UNIT_PROPERTIES = ("LoadState", "ActiveState", "UnitFileState", "InvocationID")


def entry_state(path: str) -> list[Any] | None:
    """One file system entry's metadata, None when it is absent (contents are not read: cheap on weights)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    state: list[Any] = [
        stat.S_IFMT(st.st_mode),
        stat.S_IMODE(st.st_mode),
        st.st_uid,
        st.st_gid,
        st.st_ino,
    ]
    if stat.S_ISLNK(st.st_mode):
        state.append(os.readlink(path))
    elif not stat.S_ISDIR(st.st_mode):  # a directory's times change with the files in it: trees cover those
        state += [st.st_size, st.st_mtime_ns]
    return state


def tree_state(root: str) -> dict[str, Any] | None:
    if not os.path.isdir(root):
        return None
    entries: dict[str, Any] = {}
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in [*dirs, *sorted(files)]:
            path = os.path.join(folder, name)
            entries[os.path.relpath(path, root)] = entry_state(path)
    return entries


# Answers already read in this process: the fleet check asks systemd once for every role's units.
_UNITS_SEEN: dict[str, str] = {}


def unit_states(units: Iterable[str]) -> dict[str, str]:
    wanted = list(units)
    missing = list(dict.fromkeys(name for name in wanted if name not in _UNITS_SEEN))
    if missing:
        _UNITS_SEEN.update(ask_systemd(missing))
    return {name: _UNITS_SEEN[name] for name in wanted}


def ask_systemd(names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    try:
        shown = subprocess.run(
            ["systemctl", "show", f"--property={','.join(UNIT_PROPERTIES)}", "--", *names],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as problem:  # no systemd (a container): the same answer every time, not a failure
        return {name: f"systemctl unavailable: {problem.strerror}" for name in names}
    blocks = [block for block in shown.stdout.strip().split("\n\n") if block]
    if shown.returncode != 0 or len(blocks) != len(names):
        return {name: f"systemctl show failed: {shown.stderr.strip()}" for name in names}
    states = {}
    for name, block in zip(names, blocks, strict=True):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[name] = " ".join(props.get(key, "?") for key in UNIT_PROPERTIES)
    return states


def flat(argv: list[Any]) -> list[str]:
    """An argv whose elements may be lists (a templated list of paths), one level flattened."""
    return [str(part) for arg in argv for part in (arg if isinstance(arg, list) else [arg])]


def command_state(argv: list[Any]) -> str:
    words = flat(argv)
    answered = docker_answer(words)
    if answered is None:
        try:
            ran = subprocess.run(words, capture_output=True, check=False, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as problem:
            return f"failed: {problem}"
        answered = (ran.returncode, ran.stdout)
    return f"{answered[0]} {hashlib.sha256(answered[1]).hexdigest()}"


# The docker CLI's read-only questions the roles fingerprint, answered by dockerd over its socket instead: the
# CLI (a Go binary that first negotiates the API version) costs a node about 40 ms of CPU per call, a third of
# the whole fleet check, and the API answer costs dockerd a few. The answer is the CLI's byte for byte (exit
# status and standard output), so a stamp recorded either way holds. Anything else, or any trouble reaching
# dockerd (not running, another socket, an answer this does not know), runs the CLI itself.
DOCKER_IMAGE_IDS = ("image", "inspect", "--format", "{{.Id}}")
DOCKER_RUNTIMES = ("info", "--format", "{{json .Runtimes}}")
DOCKER_SOCKET = "/var/run/docker.sock"


def docker_answer(words: list[str]) -> tuple[int, bytes] | None:
    """(exit status, stdout) of a docker CLI question above, from dockerd's API; None: run the CLI."""
    if not words or os.path.basename(words[0]) != "docker" or not on_path(words[0]):
        return None  # no CLI: running it says so, as it always did
    if os.environ.get("DOCKER_HOST") or os.environ.get("DOCKER_CONTEXT") or not os.path.exists(DOCKER_SOCKET):
        return None
    try:
        return ask_dockerd(words[1:])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ask_dockerd(question: list[str]) -> tuple[int, bytes] | None:
    if tuple(question[:4]) == DOCKER_IMAGE_IDS and len(question) > 4:
        found = [docker_get(f"/images/{quote_ref(ref)}/json") for ref in question[4:]]
        ids = [answer["Id"] for answer in found if answer is not None]
        return (0 if len(ids) == len(found) else 1), b"".join(f"{image}\n".encode() for image in ids)
    if tuple(question) == DOCKER_RUNTIMES:
        return 0, go_json(docker_get("/info")["Runtimes"]).encode() + b"\n"  # no info: TypeError, the CLI
    return None


def on_path(program: str) -> bool:
    """shutil.which's answer, without importing shutil (4 ms of the check's start: bz2, lzma)."""
    if "/" in program:
        return os.access(program, os.X_OK)
    folders = os.environ.get("PATH", os.defpath).split(os.pathsep)
    return any(os.access(os.path.join(folder or ".", program), os.X_OK) for folder in folders)


def quote_ref(ref: str) -> str:
    """An image reference in a URL path, as the CLI sends it (unreserved characters, / : @ as they are)."""
    keep = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/:@"
    return "".join(char if char in keep else "".join(f"%{b:02X}" for b in char.encode()) for char in ref)


def docker_get(path: str) -> Any:
    """dockerd's JSON answer to GET ``path`` (HTTP/1.0: the body ends with the connection); None on 404."""
    import socket  # noqa: PLC0415  (only where dockerd runs)

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(DOCKER_SOCKET)
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    head, _sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] not in (b"200", b"404"):
        raise ValueError(f"dockerd answered {head[:80]!r}")
    return None if status[1] == b"404" else json.loads(body)


def go_json(value: Any) -> str:
    """``value`` as Go's json.Marshal writes it (compact, keys in the order dockerd sent, <>& escaped)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def node_state(params: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "files": {path: entry_state(path) for path in params["files"]},
        "trees": {path: tree_state(path) for path in params["trees"]},
        "units": unit_states(params["units"]),
        "commands": {" ".join(flat(argv)): command_state(argv) for argv in params["commands"]},
    }


def first_difference(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """A sentence naming what changed, for the task's output and the report."""
    for kind in ("files", "trees", "units", "commands"):
        before, after = recorded.get(kind, {}), now[kind]
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                if kind == "units":
                    return (
                        f"unit {key} is '{after.get(key)}', was '{before.get(key)}' after the last converge"
                    )
                if kind == "commands":
                    return f"`{key}` answers differently than after the last converge"
                return f"{key} changed since the last converge"
    return "in sync"


def stamp_path(params: Mapping[str, Any]) -> str:
    return os.path.join(params["root"], f"{params['name']}.json")


def read_stamp(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as src:
            stamp = json.load(src)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: not in sync, and removed like any stale stamp
    return stamp if isinstance(stamp, dict) else {}


def check(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    path = stamp_path(params)
    stamp = read_stamp(path)
    if stamp is None:
        return {"in_sync": False, "why": "no converge recorded on this node yet", "digest": params["digest"]}
    why = stamp_in_sync(stamp, params["digest"], params)
    if why is None:
        return {"in_sync": True, "why": "in sync", "ansible_facts": stamp.get("facts", {})}
    if not module.check_mode:
        os.unlink(path)
    return {"in_sync": False, "why": why, "digest": params["digest"]}


def stamp_in_sync(stamp: Mapping[str, Any], digest: str, spec: Mapping[str, Any]) -> str | None:
    """None when ``stamp`` holds for ``digest`` and the node state of ``spec`` now, else what differs."""
    if stamp.get("schema") != SCHEMA or stamp.get("digest") != digest:
        return "the role's inputs or files changed since the last converge"
    now = node_state(spec)
    if stamp.get("state") != now:
        return first_difference(stamp.get("state", {}), now)
    return None


def fleet_check(module: AnsibleModule) -> dict[str, Any]:
    """Every role stamp the fleet stamp names, and the fleet's own, in one call (see the module's doc)."""
    params = module.params
    path = stamp_path(params)
    fleet = read_stamp(path)
    if fleet is None:
        return {"in_sync": False, "why": "no whole deploy recorded on this node yet"}
    if fleet.get("schema") != SCHEMA or fleet.get("digest") != params["digest"]:
        why: str | None = "the deployment's inputs (collection, inventory, bundle lock, API key) changed"
    else:
        why = stamp_in_sync(fleet, params["digest"], params)
    recorded: dict[str, Any] = fleet["roles"] if isinstance(fleet.get("roles"), dict) else {}
    if why is None and sorted(recorded) != sorted(params["roles"]):
        why = "the deploy's roles changed since the last one"
    facts: dict[str, Any] = {}
    stamps = {
        role: read_stamp(os.path.join(params["root"], f"{role}.json")) or {}
        for role in (sorted(recorded) if why is None else ())
    }
    specs: dict[str, dict[str, Any]] = {
        role: stamp["spec"] if isinstance(stamp.get("spec"), dict) else {} for role, stamp in stamps.items()
    }
    # every role's units in one question to systemd (unit_states keeps the answers), not one per role
    unit_states(str(unit) for spec in specs.values() if set(spec) == set(SPEC) for unit in spec["units"])
    for role, stamp in stamps.items():
        spec = specs[role]
        if set(spec) != set(SPEC):
            why = f"{role}: no converge recorded, or by an older gpufleet"
        else:
            role_why = stamp_in_sync(stamp, str(recorded[role]), spec)
            why = None if role_why is None else f"{role}: {role_why}"
        if why is not None:
            break
        facts.update(stamp.get("facts", {}))
    if why is None:
        return {"in_sync": True, "why": "in sync", "ansible_facts": facts | fleet.get("facts", {})}
    if not module.check_mode:
        os.unlink(path)
    return {"in_sync": False, "why": f"fleet: {why}"}


def fleet_record(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    if module.check_mode:
        return {"in_sync": False, "why": "check mode records nothing"}
    roles = {}
    for role in params["roles"]:
        stamp = read_stamp(os.path.join(params["root"], f"{role}.json"))
        if not stamp or stamp.get("schema") != SCHEMA:
            if os.path.exists(stamp_path(params)):  # never leave one that covers less than it says
                os.unlink(stamp_path(params))
            return {"in_sync": False, "why": f"{role} recorded no converge on this node: no fleet stamp"}
        roles[role] = stamp.get("digest")
    write_stamp(params, {"roles": roles})
    return {"in_sync": True, "why": "recorded"}


def record(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    if module.check_mode:
        return {"in_sync": False, "why": "check mode records nothing"}
    write_stamp(params, {"spec": {kind: params[kind] for kind in SPEC}})
    # A cache of what the converge did, not a change of its own: a second run stays changed=0.
    return {"in_sync": True, "why": "recorded"}


def write_stamp(params: Mapping[str, Any], more: Mapping[str, Any]) -> None:
    """The stamp, atomically and readable by root alone (the state of what the roles manage)."""
    stamp = {
        "schema": SCHEMA,
        "digest": params["digest"],
        "state": node_state(params),
        "facts": params["facts"],
        **more,
    }
    os.makedirs(params["root"], mode=0o700, exist_ok=True)
    path = stamp_path(params)
    staging = f"{path}.tmp"
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(stamp, out, sort_keys=True)
    os.replace(staging, path)


ACTIONS = {"check": check, "record": record, "fleet_check": fleet_check, "fleet_record": fleet_record}


# The fleet check without Ansible's module wrapper (action plugin gpufleet_converged, fleet_check.yml):
# fleet_record.yml installs this file on the node, and the check runs it with its parameters as JSON on the
# command line. One check per node is the whole of a no-op re-run's per-node work, and the wrapper (unpacking
# and compiling Ansible's module code on the node) cost 5 times what the check itself does.
SCRIPT_FLAG = "--fleet-check"


def script_main(arguments: str) -> None:
    params = {"name": "fleet", "files": [], "trees": [], "units": [], "commands": [], "roles": []}
    params |= json.loads(arguments)
    params.setdefault("root", "/var/lib/gpufleet/converged")
    node = SimpleNamespace(params=params, check_mode=bool(params.pop("check_mode", False)))
    try:
        result = {"changed": False, **fleet_check(node)}  # a SimpleNamespace: params and check_mode suffice
    except OSError as problem:
        result = {"failed": True, "msg": f"{os.uname().nodename}: {problem} (stamp {stamp_path(params)})"}
    sys.stdout.write(json.dumps(result) + "\n")  # the action plugin reads it (not a module: no exit_json)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == SCRIPT_FLAG:
        script_main(sys.argv[2])
        return
    from ansible.module_utils.basic import AnsibleModule  # noqa: PLC0415  (not needed as a script)

    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "state": {
                "type": "str",
                "default": "check",
                "choices": ["check", "record", "fleet_check", "fleet_record"],
            },
            "roles": {"type": "list", "elements": "str", "default": []},
            "digest": {"type": "str", "required": True},
            "files": {"type": "list", "elements": "path", "default": []},
            "trees": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "commands": {"type": "list", "elements": "list", "default": []},
            "facts": {"type": "dict", "default": {}},
            "root": {"type": "path", "default": "/var/lib/gpufleet/converged"},
        },
        supports_check_mode=True,
    )
    try:
        result = ACTIONS[module.params["state"]](module)
    except OSError as problem:
        fix = (
            "run the play as root (become: true; gpufleet's playbooks do)"
            if isinstance(problem, PermissionError) and os.geteuid() != 0
            else "check the node's disk"
        )
        module.fail_json(
            msg=f"{os.uname().nodename}: {problem} (stamp {stamp_path(module.params)}). "
            f"Fix: {fix}, then run again."
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
