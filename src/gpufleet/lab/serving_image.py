"""Build the lab's CPU serving image (vLLM's CPU build + Ray) as a ``docker save`` tarball, with no daemon.

Two layers, each cached under ``~/.cache/gpufleet/serving-image`` by the hash of its inputs (the spec,
``images/vllm-cpu/image.yml``): a Debian root file system from ``debootstrap --variant=minbase``, and a
virtual environment installed from a resolved wheel set inside that root file system (chroot, no index).
The image tarball (``manifest.json`` + config JSON + ``<diff_id>/layer.tar``) is what ``docker load``
reads. A warm rebuild finds every piece by its key and takes seconds.

Usage (root: debootstrap and chroot):
``python -m gpufleet.lab.serving_image build [--spec FILE] [--output FILE]``
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# Bump when the build steps change in a way the spec does not show, to invalidate every cached layer.
RECIPE = "4"
DEFAULT_SPEC = Path(__file__).resolve().parents[3] / "images" / "vllm-cpu" / "image.yml"
PATH = "/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Left out of the base layer: docker provides them at run time, or they are only apt's leftovers.
BASE_EXCLUDES = ("dev/*", "proc/*", "sys/*", "run/*", "tmp/*", "var/cache/apt/*", "var/lib/apt/lists/*")


class ImageBuildError(Exception):
    """A build step failed; the message says which step and what it printed."""


@dataclass(frozen=True)
class ImageSpec:
    """What goes into the image (images/vllm-cpu/image.yml)."""

    tag: str
    suite: str
    mirror: str
    packages: tuple[str, ...]
    venv: str
    requirements: tuple[str, ...]
    exclude: tuple[str, ...]
    # Paths under the venv left out of the layer, and whether the venv's ELF files lose their debug sections:
    # bytes no server reads, which every `docker load` of the lab reads, hashes and writes (issue 33).
    drop: tuple[str, ...] = ()
    strip_debug: bool = False
    env: dict[str, str] = field(default_factory=dict)
    cmd: tuple[str, ...] = ("vllm", "--version")
    workdir: str = "/"

    @classmethod
    def load(cls, path: Path) -> ImageSpec:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for key in ("packages", "requirements", "exclude", "drop", "cmd"):
            if key in data:
                data[key] = tuple(data[key])
        data["env"] = {str(k): str(v) for k, v in data.get("env", {}).items()}
        return cls(**data)

    def key(self, *names: str) -> str:
        """A short hash of the named fields (and the recipe version): the cache key of one layer."""
        picked = {name: getattr(self, name) for name in names}
        blob = json.dumps([RECIPE, picked], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Layer:
    path: Path
    diff_id: str  # "sha256:<hex>" of the uncompressed layer tar
    size: int


@dataclass(frozen=True)
class BuiltImage:
    """The result: where the tarball is, and what ``docker image inspect`` will say about it."""

    path: Path
    tag: str
    image_id: str
    size: int
    sha256: str  # of the tarball: what a bundle lock or image_distribution pins
    diff_ids: tuple[str, ...]
    seconds: dict[str, float]


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpufleet" / "serving-image"


def run(args: Sequence[str], step: str, env: dict[str, str] | None = None, inherit: bool = True) -> str:
    """Run one build command; on failure raise with the step's name and the end of its output."""
    full_env = {**os.environ, **(env or {})} if inherit else dict(env or {})
    proc = subprocess.run(list(args), capture_output=True, text=True, env=full_env, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise ImageBuildError(f"{step} failed (exit {proc.returncode}): {' '.join(args)}\n{tail}")
    return proc.stdout


@contextmanager
def locked(cache: Path) -> Iterator[None]:
    """One build at a time per cache directory (tests and developers may share it)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def fresh_dir(path: Path) -> Path:
    """A scratch directory beside ``path``, emptied first; renamed into place when a step succeeds."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def base_rootfs(spec: ImageSpec, cache: Path) -> Path:
    """Debootstrap the base root file system once per (suite, mirror, packages)."""
    root = cache / "rootfs" / spec.key("suite", "mirror", "packages")
    if (root / "etc" / "os-release").exists():
        return root
    tmp = fresh_dir(root)
    run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(spec.packages)}",
            spec.suite,
            str(tmp),
            spec.mirror,
        ],
        "debootstrap",
    )
    # Docker mounts its own resolv.conf and hostname; the build machine's must not leak into the image.
    for name in ("resolv.conf", "hostname"):
        (tmp / "etc" / name).write_text("", encoding="utf-8")
    run(["chroot", str(tmp), "apt-get", "clean"], "apt-get clean")
    tmp.rename(root)
    return root


def wheel_requirements(wheel: Path, exclude: Sequence[str]) -> list[str]:
    """The run-time requirements a wheel declares for this platform, less the excluded projects."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode("utf-8"))
    skip = {canonicalize_name(n) for n in exclude}
    wanted = []
    for line in metadata.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) not in skip:
            req.marker = None
            wanted.append(str(req))
    return wanted


def wheelhouse(spec: ImageSpec, cache: Path) -> Path:
    """Resolve and download every wheel once per (requirements, exclude); later builds need no network."""
    house = cache / "wheels" / spec.key("requirements", "exclude")
    if (house / "requirements.txt").exists():
        return house
    tmp = fresh_dir(house)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(tmp)]
    env = {"PIP_CACHE_DIR": str(cache / "pip")}
    run([*pip, "--no-deps", spec.requirements[0]], "pip download (vLLM)", env)
    main = next(tmp.glob("*.whl"))
    reqs = [*spec.requirements, *wheel_requirements(main, spec.exclude)]
    (tmp / "requirements.in").write_text("\n".join(reqs) + "\n", encoding="utf-8")
    run([*pip, "--requirement", str(tmp / "requirements.in")], "pip download (dependencies)", env)
    skip = {canonicalize_name(n) for n in spec.exclude}
    for wheel in tmp.glob("*.whl"):
        if canonicalize_name(wheel.name.split("-")[0]) in skip:
            wheel.unlink()
    pins = sorted("==".join(w.name.split("-")[:2]) for w in tmp.glob("*.whl"))
    (tmp / "requirements.txt").write_text("\n".join(pins) + "\n", encoding="utf-8")
    tmp.rename(house)
    return house


def chroot_script(root: Path, script: str, binds: dict[Path, str], step: str) -> str:
    """Run a shell script chrooted in ``root`` with bind mounts that vanish with a private mount namespace."""
    mounts = [f"mount -t proc proc {root}/proc"]
    for source, target in binds.items():
        mounts += [f"mkdir -p {root}{target}", f"mount --bind -o ro {source} {root}{target}"]
    outer = " && ".join([*mounts, f"chroot {root} /bin/sh -euc {shlex.quote(script)}"])
    # A clean environment: the build machine's PIP_* and proxy settings must not leak into the chroot.
    env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    return run(
        ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-euc", outer], step, env, False
    )


# What serving imports, not only the packages' tops: an `exclude:` that drops a dependency the server imports
# at start fails the build here, not a deploy (the API server, the engine, the CPU worker, both executors).
IMPORT_CHECK = (
    "vllm",
    "ray",
    "torch",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.core",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.executor.ray_executor",
)


def install_venv(spec: ImageSpec, base: Path, house: Path, work: Path) -> None:
    """Copy the base root file system, then install the wheel set into a venv inside it."""
    run(["cp", "-a", f"{base}/.", str(work)], "copy base root file system")
    script = (
        f"python3 -m venv {spec.venv}\n"
        f"{spec.venv}/bin/pip install --quiet --no-index --no-deps /wheels/*.whl\n"
    )
    chroot_script(work, script, {house: "/wheels"}, "pip install (chroot)")
    venv = work / spec.venv.lstrip("/")
    alias_vllm_metadata(venv)
    slim_venv(venv, spec.drop, spec.strip_debug)
    chroot_script(work, f"{spec.venv}/bin/python -c 'import {', '.join(IMPORT_CHECK)}'", {}, "import check")
    os.rmdir(work / "wheels")


def slim_venv(venv: Path, drop: Sequence[str], strip_debug: bool) -> None:
    """Remove the ``drop`` paths (relative to the venv; globs) and, with ``strip_debug``, the debug sections
    of every ELF file that has them (``strip --strip-debug``: the symbol tables stay, and nothing that runs
    changes). The import check runs after this."""
    for pattern in drop:
        matched = sorted(venv.glob(pattern))
        if not matched:
            raise ImageBuildError(
                f"serving image: drop: found nothing for {pattern!r} under {venv}; expected a path the venv"
                " holds. Fix: correct or remove it under drop: in the spec (images/vllm-cpu/image.yml)"
            )
        for path in matched:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    if not strip_debug:
        return
    missing = [tool for tool in ("readelf", "strip") if shutil.which(tool) is None]
    if missing:
        raise ImageBuildError(
            f"serving image: strip_debug: found no {' or '.join(missing)}; expected binutils installed."
            " Fix: apt-get install -y binutils (make lab-prereqs does), or set strip_debug: false in the spec"
        )
    for path in sorted(venv.rglob("*")):
        if path.is_symlink() or not path.is_file() or path.stat().st_size < 4096:
            continue
        with path.open("rb") as handle:
            if handle.read(4) != b"\x7fELF":
                continue
        sections = run(["readelf", "--section-headers", "--wide", str(path)], f"readelf {path.name}")
        if ".debug_info" in sections:
            run(["strip", "--strip-debug", str(path)], f"strip {path.name}")


def alias_vllm_metadata(venv: Path) -> None:
    """Add a ``vllm`` dist-info: vLLM's CLI asks for ``vllm``'s version and fails on ``vllm-cpu``'s."""
    site = next(venv.glob("lib/python3*/site-packages"))
    source = next(site.glob("vllm_cpu-*.dist-info"))
    text = (source / "METADATA").read_text(encoding="utf-8")
    version = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Version: "))
    alias = site / f"vllm-{version}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    lines = [
        "Name: vllm"
        if line == "Name: vllm-cpu"
        else (f"Version: {version}+cpu" if line.startswith("Version: ") else line)
        for line in text.splitlines()
    ]
    (alias / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (alias / "INSTALLER").write_text("metadata-alias\n", encoding="utf-8")


def write_layer(root: Path, members: Sequence[str], dest: Path, excludes: Sequence[str] = ()) -> Layer:
    """GNU tar the members (relative to root) into ``dest``, hashing the stream on the way (the diff_id)."""
    args = [
        "tar",
        "--create",
        "--file=-",
        f"--directory={root}",
        "--numeric-owner",
        "--sort=name",
        "--anchored",
    ]
    args += [f"--exclude={pattern}" for pattern in excludes]
    digest = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".tmp")
    with subprocess.Popen([*args, *members], stdout=subprocess.PIPE) as proc, tmp.open("wb") as out:
        assert proc.stdout is not None
        while chunk := proc.stdout.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if proc.returncode != 0:
        raise ImageBuildError(f"tar of {root} failed (exit {proc.returncode})")
    tmp.rename(dest)
    layer = Layer(dest, f"sha256:{digest.hexdigest()}", dest.stat().st_size)
    dest.with_suffix(".json").write_text(
        json.dumps({"diff_id": layer.diff_id, "size": layer.size}), encoding="utf-8"
    )
    return layer


def cached_layer(path: Path) -> Layer | None:
    meta = path.with_suffix(".json")
    if not (path.exists() and meta.exists()):
        return None
    data = json.loads(meta.read_text(encoding="utf-8"))
    return Layer(path, data["diff_id"], data["size"])


def base_layer(spec: ImageSpec, cache: Path) -> Layer:
    dest = cache / "layers" / f"base-{spec.key('suite', 'mirror', 'packages')}.tar"
    if layer := cached_layer(dest):
        return layer
    root = base_rootfs(spec, cache)
    dest.parent.mkdir(parents=True, exist_ok=True)
    return write_layer(root, sorted(p.name for p in root.iterdir()), dest, BASE_EXCLUDES)


def venv_layer(spec: ImageSpec, cache: Path, keep_rootfs: bool) -> Layer:
    key = spec.key("suite", "mirror", "packages", "venv", "requirements", "exclude", "drop", "strip_debug")
    dest = cache / "layers" / f"venv-{key}.tar"
    if layer := cached_layer(dest):
        return layer
    house = wheelhouse(spec, cache)
    full = cache / "rootfs" / f"full-{key}"
    work = fresh_dir(full)
    install_venv(spec, base_rootfs(spec, cache), house, work)
    dest.parent.mkdir(parents=True, exist_ok=True)
    layer = write_layer(work, [spec.venv.lstrip("/")], dest)
    if keep_rootfs:
        shutil.rmtree(full, ignore_errors=True)
        work.rename(full)
    else:
        shutil.rmtree(work)
    return layer


def image_config(spec: ImageSpec, layers: Sequence[Layer], labels: dict[str, str]) -> bytes:
    env = {"PATH": PATH, "VIRTUAL_ENV": spec.venv, **spec.env}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",  # fixed: the same inputs give the same image ID
        "config": {
            "Env": [f"{k}={v}" for k, v in env.items()],
            "Cmd": list(spec.cmd),
            "WorkingDir": spec.workdir,
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created_by": f"gpufleet.lab.serving_image layer {i}"} for i in range(len(layers))],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def write_archive(dest: Path, tag: str, config: bytes, layers: Sequence[Layer]) -> None:
    """The docker-archive format: manifest.json, <config-hex>.json, <diff-hex>/layer.tar, repositories."""
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_names = [f"{layer.diff_id.split(':')[1]}/layer.tar" for layer in layers]
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": layer_names}]
    repo, _, version = tag.rpartition(":")
    repositories = {repo: {version: layer_names[-1].split("/")[0]}}
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, layer in zip(layer_names, layers, strict=True):
            archive.add(str(layer.path), arcname=name)
        for name, blob in ((config_name, config), ("manifest.json", json.dumps(manifest).encode())):
            add_bytes(archive, name, blob)
        add_bytes(archive, "repositories", json.dumps(repositories).encode())
    tmp.rename(dest)


def add_bytes(archive: tarfile.TarFile, name: str, blob: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(blob)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(blob))


def pinned_versions(spec: ImageSpec, cache: Path) -> dict[str, str]:
    """Image labels: the versions that matter when two nodes must run the same software."""
    house = cache / "wheels" / spec.key("requirements", "exclude")
    pins = dict(line.split("==", 1) for line in (house / "requirements.txt").read_text().split())
    wanted = {"vllm_cpu": "vllm", "torch": "torch", "ray": "ray", "transformers": "transformers"}
    return {f"org.gpufleet.{label}": pins[name] for name, label in wanted.items() if name in pins}


def build(spec: ImageSpec, cache: Path | None = None, keep_rootfs: bool = False) -> BuiltImage:
    """Build (or find in the cache) the image tarball for ``spec``."""
    cache = cache or default_cache()
    seconds: dict[str, float] = {}
    with locked(cache):
        start = time.monotonic()
        base = base_layer(spec, cache)
        seconds["base_layer"] = time.monotonic() - start
        venv = venv_layer(spec, cache, keep_rootfs)
        seconds["venv_layer"] = time.monotonic() - start - seconds["base_layer"]
        labels = {"org.gpufleet.suite": spec.suite, **pinned_versions(spec, cache)}
        config = image_config(spec, [base, venv], labels)
        image_id = "sha256:" + hashlib.sha256(config).hexdigest()
        dest = cache / "images" / f"{spec.tag.replace('/', '_').replace(':', '_')}-{image_id[7:23]}.tar"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_archive(dest, spec.tag, config, [base, venv])
        digest = archive_sha256(dest)
        seconds["total"] = time.monotonic() - start
    size = dest.stat().st_size
    return BuiltImage(dest, spec.tag, image_id, size, digest, (base.diff_id, venv.diff_id), seconds)


def archive_sha256(archive: Path) -> str:
    """The tarball's sha256, computed once and kept beside it."""
    record = archive.with_suffix(".sha256")
    if record.exists():
        return record.read_text(encoding="utf-8").strip()
    digest = hashlib.sha256()
    with archive.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    record.write_text(digest.hexdigest() + "\n", encoding="utf-8")
    return digest.hexdigest()


def publish(image: BuiltImage, output: Path) -> None:
    """Place the tarball at ``output``: a hard link when on the same file system, else a copy."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.unlink(missing_ok=True)
    try:
        os.link(image.path, output)
    except OSError:
        shutil.copyfile(image.path, output)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpufleet.lab.serving_image", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="build the image tarball (cached) and print what was built as JSON")
    cmd.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="image spec (default: %(default)s)")
    cmd.add_argument("--cache", type=Path, default=None, help="default: ~/.cache/gpufleet/serving-image")
    cmd.add_argument("--output", type=Path, help="also place the tarball here (hard link or copy)")
    cmd.add_argument("--keep-rootfs", action="store_true", help="keep the full root file system")
    args = parser.parse_args(argv)
    try:
        image = build(ImageSpec.load(args.spec), args.cache, args.keep_rootfs)
    except ImageBuildError as exc:
        print(f"gpufleet.lab.serving_image: {exc}", file=sys.stderr)
        return 1
    if args.output:
        publish(image, args.output)
    result: dict[str, Any] = asdict(image)
    result["path"] = str(image.path)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
