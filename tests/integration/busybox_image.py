"""A one-layer busybox image as a ``docker save`` archive, written without a registry or a daemon.

The layer is Debian's busybox-static (one static binary plus the applet links the tests use); the archive
is written by gpufleet's own ``write_docker_archive`` (the bundle builder's), the layout ``docker load``
reads on every Docker version the lab runs. Cached under ``~/.cache/gpufleet/images/``.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path

from docker_tarball import apt_download, cache_root

from gpufleet.bundle.debian import extract_from_deb
from gpufleet.bundle.images import write_docker_archive
from gpufleet.lab.system import file_lock

IMAGE_REF = "gpufleet-test/busybox:1"
APPLETS = ("sh", "echo", "cat", "true", "uname", "hostname", "sleep")


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


def build_busybox_image(suite: str = "bookworm") -> Path:
    """Return the path of the cached ``docker save`` archive of IMAGE_REF, building it if needed."""
    folder = cache_root().parent / "images"
    path = folder / "gpufleet-test_busybox_1.tar"
    with file_lock(folder / ".lock"):
        if not path.is_file():
            with tempfile.TemporaryDirectory(prefix="busybox-") as tmp:
                (deb,) = apt_download(suite, ["busybox-static"], Path(tmp))
                busybox = extract_from_deb(deb, "bin/busybox")
            write_docker_archive(path, IMAGE_REF, [_layer(busybox)], ["sh"])
        return path
