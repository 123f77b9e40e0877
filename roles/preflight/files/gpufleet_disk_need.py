"""What the bundle's artifacts still need on this host, per file system, against what is free there.

argv[1]: JSON list of {"label": str, "path": str, "bytes": int, "image_id": str|null, "docker": str|null,
"grows": bool}. An image already in docker (by ID) needs nothing; a directory that already holds part of what
it needs (the model, on a re-run) needs only the rest when "grows". Paths that do not exist yet count against
the file system of their nearest existing parent. Prints a JSON list, one entry per file system:
{"path": where it was measured, "free": bytes, "need": bytes, "items": ["label: bytes", ...]}; exits 0.
"""

import contextlib
import json
import os
import subprocess
import sys
from typing import Any


def existing(path: str) -> str:
    while not os.path.exists(path) and path not in ("", "/"):
        path = os.path.dirname(path) or "/"
    return path or "/"


def present_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def loaded(docker: str, image_id: str) -> bool:
    if not os.access(docker, os.X_OK):
        return False
    probe = subprocess.run([docker, "image", "inspect", image_id], capture_output=True, check=False)
    return probe.returncode == 0


def main() -> int:
    by_device: dict[int, dict[str, Any]] = {}
    for item in json.loads(sys.argv[1]):
        need = int(item["bytes"])
        if item.get("image_id") and loaded(item.get("docker") or "", item["image_id"]):
            need = 0
        elif item.get("grows") and os.path.isdir(item["path"]):
            need = max(0, need - present_bytes(item["path"]))
        where = existing(item["path"])
        stat = os.statvfs(where)
        free = stat.f_bavail * stat.f_frsize
        fresh = {"path": where, "free": free, "need": 0, "items": []}
        entry = by_device.setdefault(os.stat(where).st_dev, fresh)
        entry["need"] += need
        if need:
            entry["items"].append(f"{item['label']} {need / 2**30:.2f} GiB under {item['path']}")
    print(json.dumps(list(by_device.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
