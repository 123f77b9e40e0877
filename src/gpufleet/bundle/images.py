"""Container images as ``docker save`` tarballs: read their image ID, write one without a daemon, compress.

The image ID that ``docker load`` reports is the sha256 of the image's config JSON, so it can be read from
the tarball's manifest.json before any node sees it, and compared with what the node has afterwards.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import IO

from gpufleet.bundle.debian import Apt, extract_from_deb
from gpufleet.bundle.fetch import BuildContext, BuildError, copy_file, run
from gpufleet.bundle.manifest import (
    BusyboxImageSource,
    DockerArchiveSource,
    DockerDaemonSource,
    ImageArtifact,
    SkopeoSource,
)
from gpufleet.compat import cuda_from_requirement

_FIXED_MTIME = 946684800
BUSYBOX_APPLETS = ("sh", "ls", "cat", "echo", "sleep", "true", "false", "env", "wget", "httpd", "sha256sum")


def _open_tar(path: Path) -> tarfile.TarFile:
    """Open a plain or gzip docker-archive (zstd ones are decompressed by the caller first)."""
    return tarfile.open(path, mode="r:*")


def image_id(archive: Path) -> str:
    """The image ID (``sha256:<config digest>``) of the first image in a docker-archive tarball."""
    try:
        with _open_tar(archive) as tar:
            member = tar.extractfile("manifest.json")
            if member is None:
                raise KeyError("manifest.json")
            manifest = json.load(member)
            config = tar.extractfile(manifest[0]["Config"])
            if config is None:
                raise KeyError(manifest[0]["Config"])
            return "sha256:" + hashlib.sha256(config.read()).hexdigest()
    except (tarfile.TarError, KeyError, IndexError, ValueError, OSError) as exc:
        raise BuildError(
            f"{archive}: not a docker-archive tarball ({exc}). Fix: give a file written by `docker save`."
        ) from None


DIST_INFO = re.compile(r"(?:site|dist)-packages/(vllm|ray|torch)-([0-9][^/-]*)\.dist-info/METADATA$")
PYTHON_LIB = re.compile(r"(?:^|/)lib/python(3\.\d+)/(?:site|dist)-packages/")


def image_contents(archive: Path) -> dict[str, str | None]:
    """What an image needs and holds, from its own config and layers (read once, at bundle build).

    ``cuda``: its ``NVIDIA_REQUIRE_CUDA`` (what the NVIDIA runtime enforces) or ``CUDA_VERSION``;
    ``vllm``, ``ray``, ``torch``: the versions of their dist-info in site-packages (None = absent);
    ``python``: the site-packages' Python.
    """
    found: dict[str, str | None] = {"cuda": None, "vllm": None, "ray": None, "torch": None, "python": None}
    try:
        with _open_tar(archive) as tar:
            manifest = json.load(_extract(tar, "manifest.json"))
            config = json.load(_extract(tar, manifest[0]["Config"])).get("config") or {}
            env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
            labels = config.get("Labels") or {}
            requirement = labels.get("NVIDIA_REQUIRE_CUDA") or env.get("NVIDIA_REQUIRE_CUDA") or ""
            found["cuda"] = cuda_from_requirement(requirement) or cuda_from_requirement(
                env.get("CUDA_VERSION", "")
            )
            for layer in manifest[0]["Layers"]:
                with tarfile.open(fileobj=_extract(tar, layer), mode="r|*") as inner:
                    for member in inner:
                        if match := DIST_INFO.search(member.name):
                            found[match[1]] = match[2]
                            if python := PYTHON_LIB.search(member.name):
                                found["python"] = python[1]
    except (tarfile.TarError, KeyError, IndexError, ValueError, OSError) as exc:
        raise BuildError(
            f"{archive}: cannot read the image's config and layers ({exc}). Fix: give a `docker save` file."
        ) from None
    return found


def _extract(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    member = tar.extractfile(name)
    if member is None:
        raise KeyError(name)
    return member


def _member(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, _FIXED_MTIME
    return info, io.BytesIO(data)


def tar_layer(files: dict[str, bytes]) -> bytes:
    """An image layer (a plain tar) holding ``files``, with fixed times so the layer digest is stable."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(files):
            tar.addfile(*_member(name, files[name]))
    return buf.getvalue()


def _busybox_layer(busybox: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for directory in ("bin", "tmp"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = (
                tarfile.DIRTYPE,
                0o1777 if directory == "tmp" else 0o755,
                _FIXED_MTIME,
            )
            tar.addfile(info)
        tar.addfile(*_member("bin/busybox", busybox, 0o755))
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, _FIXED_MTIME
            tar.addfile(link)
    return buf.getvalue()


def write_docker_archive(
    dest: Path,
    reference: str,
    layers: list[bytes],
    cmd: list[str],
    *,
    env: tuple[str, ...] = ("PATH=/bin",),
    labels: dict[str, str] | None = None,
) -> str:
    """Write a ``docker save``-format tarball (uncompressed layers); returns its image ID."""
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "2000-01-01T00:00:00Z",
            "config": {"Cmd": cmd, "Env": list(env)} | ({"Labels": labels} if labels else {}),
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created": "2000-01-01T00:00:00Z", "created_by": "gpufleet bundle"} for _ in layers],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    config_hex = hashlib.sha256(config).hexdigest()
    layer_paths = [f"{diff.split(':')[1]}/layer.tar" for diff in diff_ids]
    manifest = json.dumps([{"Config": f"{config_hex}.json", "RepoTags": [reference], "Layers": layer_paths}])
    tmp = dest.with_name(dest.name + ".part")
    with tarfile.open(tmp, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(*_member(f"{config_hex}.json", config))
        for path, layer in zip(layer_paths, layers, strict=True):
            tar.addfile(*_member(path, layer))
        tar.addfile(*_member("manifest.json", manifest.encode()))
    os.replace(tmp, dest)
    return f"sha256:{config_hex}"


def _save_busybox(ctx: BuildContext, image: ImageArtifact, source: BusyboxImageSource, dest: Path) -> None:
    apt = Apt(ctx, source.mirror, source.suite, ["main"])
    with tempfile.TemporaryDirectory(prefix="gpufleet-busybox-", dir=ctx.work) as tmp:
        debs = apt.download({"busybox-static": source.package_version}, Path(tmp), with_dependencies=False)
        busybox = extract_from_deb(debs[0], "bin/busybox")
    write_docker_archive(dest, image.reference, [_busybox_layer(busybox)], ["sh"])


def _save_daemon(image: ImageArtifact, source: DockerDaemonSource, dest: Path) -> None:
    env = {"DOCKER_HOST": source.docker_host} if source.docker_host else None
    run(["docker", "save", "-o", str(dest), image.reference], what=image.reference, env=env)


def _save_skopeo(image: ImageArtifact, source: SkopeoSource, dest: Path) -> None:
    run(
        ["skopeo", "copy", "--quiet", source.reference, f"docker-archive:{dest}:{image.reference}"],
        what=image.reference,
    )


def compress(plain: Path, dest: Path, compression: str) -> None:
    """Compress deterministically (gzip without a timestamp; zstd is deterministic by itself)."""
    if compression == "none":
        os.replace(plain, dest)
    elif compression == "gzip":
        with plain.open("rb") as src, gzip.GzipFile(dest, "wb", compresslevel=6, mtime=0) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        plain.unlink()
    else:
        run(["zstd", "-q", "-f", "-6", "--rm", str(plain), "-o", str(dest)], what=dest.name)


def save_image(ctx: BuildContext, image: ImageArtifact, dest: Path) -> str:
    """Produce ``dest`` for one image entry; returns the image ID (checked against the manifest's pin)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    plain = ctx.work / "images" / PurePosixPath(image.bundle_path()).name.split(".tar")[0]
    plain = plain.with_suffix(plain.suffix + ".tar")
    plain.parent.mkdir(parents=True, exist_ok=True)
    source = image.source
    if isinstance(source, DockerArchiveSource):
        copy_file(ctx, ctx.local(source.path), plain, source.sha256)
    elif isinstance(source, BusyboxImageSource):
        _save_busybox(ctx, image, source, plain)
    elif isinstance(source, DockerDaemonSource):
        _save_daemon(image, source, plain)
    else:
        _save_skopeo(image, source, plain)
    found = image_id(plain)
    if image.id and found != image.id:
        plain.unlink()
        raise BuildError(
            f"image {image.reference}: image ID {found}, expected {image.id} (images[].id). "
            "Fix: correct the pinned id, or the source if it holds the wrong image."
        )
    compress(plain, dest, image.compression)
    return found
