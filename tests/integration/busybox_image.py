"""A one-layer busybox image as a ``docker save`` archive, written without a registry or a daemon.

The layer is Debian's busybox-static (one static binary plus the applet links the tests use); the
archive has the layout ``docker load`` reads on every Docker version the lab runs: ``manifest.json``,
the image config named by its sha256, and ``<layer>/layer.tar``. Cached under
``~/.cache/gpufleet/images/``.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

from docker_tarball import apt_download, cache_root, file_lock

IMAGE_REF = "gpufleet-test/busybox:1"
APPLETS = ("sh", "echo", "cat", "true", "uname", "hostname")


def _layer(busybox: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        binary = tarfile.TarInfo("bin/busybox")
        binary.size, binary.mode = len(busybox), 0o755
        tar.addfile(binary, io.BytesIO(busybox))
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return buffer.getvalue()


def _archive(layer: bytes, ref: str) -> bytes:
    diff_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "gpufleet tests: busybox-static"}],
        },
        sort_keys=True,
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [ref], "Layers": [f"{diff_id}/layer.tar"]}]
    ).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (
            (f"{diff_id}/layer.tar", layer),
            (config_name, config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_busybox_image(suite: str = "bookworm") -> Path:
    """Return the path of the cached ``docker save`` archive of IMAGE_REF, building it if needed."""
    folder = cache_root().parent / "images"
    path = folder / "gpufleet-test_busybox_1.tar"
    with file_lock(folder / ".lock"):
        if path.is_file():
            return path
        with tempfile.TemporaryDirectory(prefix="busybox-") as tmp:
            deb = apt_download(suite, ["busybox-static"], Path(tmp))["busybox-static"]
            subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/tree"], check=True)
            busybox = Path(f"{tmp}/tree/bin/busybox").read_bytes()
        path.with_suffix(".partial").write_bytes(_archive(_layer(busybox), IMAGE_REF))
        path.with_suffix(".partial").rename(path)
        return path
