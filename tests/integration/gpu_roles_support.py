"""Test support for the nvidia_driver and cuda_toolkit roles: a real offline CUDA apt repository and bundles.

The CUDA repository is Debian trixie's non-free ``nvidia-cuda-toolkit`` 12.4.131 with every dependency,
downloaded once with a private apt configuration (the machine's own apt is not touched) from the same mirror
host as /etc/apt/sources.list, indexed in Python (no dpkg-dev needed) and cached under
~/.cache/gpufleet/offline-apt/. The dependency closure is resolved against an empty package database, so the
repository holds everything a minimal trixie host could lack (1.8 GB, 118 packages, measured).

Also callable from Molecule's create playbooks: ``python gpu_roles_support.py cuda-bundle DIR`` and
``python gpu_roles_support.py driver-bundle DIR VERSION``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.bundle.lock import Lock, lock_entry, write_lock

REPO = Path(__file__).resolve().parents[2]
DOUBLE = REPO / "tests" / "doubles" / "nvidia-installer-double.sh"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpufleet" / "offline-apt"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
CUDA_PACKAGE = "nvidia-cuda-toolkit"
CUDA_VERSION_FULL = "12.4.131"
CUDA_SUITE = "trixie"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def debian_mirror() -> str:
    """The Debian mirror the machine's own apt uses (first deb.debian.org-style URI of a 'debian' archive)."""
    for source in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if not source.is_file():
            continue
        for match in re.finditer(
            r"(?:URIs:\s*|^deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s", source.read_text(), re.M
        ):
            return match.group(1)
    return DEFAULT_MIRROR


def _apt_options(root: Path) -> list[str]:
    return [
        f"-oDir::Etc::SourceList={root / 'sources.list'}",
        "-oDir::Etc::SourceParts=/nonexistent",
        f"-oDir::State::Lists={root / 'lists'}",
        f"-oDir::State::status={root / 'status'}",
        f"-oDir::Cache={root / 'cache'}",
        "-oAPT::Architecture=amd64",
        "-oAPT::Architectures=amd64",
        "-oAPT::Install-Recommends=false",
        "-oDebug::NoLocking=true",
    ]


def _control_fields(deb: Path) -> str:
    text = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
    return text.rstrip("\n")


def write_packages_index(repo: Path) -> None:
    """A flat repository (``deb [trusted=yes] file:DIR ./``): Packages + Packages.gz beside the .debs."""
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        data = deb.read_bytes()
        stanzas.append(
            f"{_control_fields(deb)}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    index = "\n".join(stanzas)
    (repo / "Packages").write_text(index)
    with gzip.GzipFile(repo / "Packages.gz", "wb", mtime=0) as out:
        out.write(index.encode())


def cuda_offline_repo(log: list[str] | None = None) -> Path:
    """The cached local apt repository of nvidia-cuda-toolkit 12.4.131 (trixie), built on first use."""
    repo = CACHE / f"{CUDA_SUITE}-{CUDA_PACKAGE}-{CUDA_VERSION_FULL}"
    if (repo / "Packages.gz").is_file():
        return repo
    root = CACHE / f"apt-{CUDA_SUITE}"
    for sub in ("lists/partial", "cache"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "status").write_text("")
    (root / "sources.list").write_text(
        f"deb [signed-by={KEYRING}] {debian_mirror()} {CUDA_SUITE} main contrib non-free\n"
    )
    options = _apt_options(root)
    started = time.monotonic()
    subprocess.run(["apt-get", "-q", *options, "update"], check=True, capture_output=True)
    work = repo.with_name(repo.name + ".part")
    (work / "partial").mkdir(parents=True, exist_ok=True)
    pin = f"{CUDA_PACKAGE}={CUDA_VERSION_FULL}*"
    subprocess.run(
        [
            "apt-get",
            "-q",
            "-y",
            *options,
            f"-oDir::Cache::archives={work}",
            "install",
            "--download-only",
            pin,
        ],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(work / "partial", ignore_errors=True)
    (work / "lock").unlink(missing_ok=True)
    write_packages_index(work)
    os.replace(work, repo)
    if log is not None:
        debs = list(repo.glob("*.deb"))
        size = sum(p.stat().st_size for p in debs) / 1e9
        log.append(f"cuda repo: {len(debs)} debs, {size:.2f} GB in {time.monotonic() - started:.0f} s")
    return repo


def _link_or_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def write_bundle(bundle: Path, files: dict[str, Path], versions: dict[str, str] | None = None) -> Path:
    """A bundle directory holding ``files`` (bundle path -> source) and a bundle.lock.yml listing them."""
    entries = []
    for rel, src in sorted(files.items()):
        _link_or_copy(src, bundle / rel)
        entries.append(lock_entry(bundle, rel, (versions or {}).get(rel.split("/")[0], ""), "test"))
    write_lock(bundle, Lock(manifest="tests/integration/gpu_roles_support.py", files=entries))
    return bundle


def cuda_bundle(bundle: Path) -> Path:
    """A bundle whose cuda/12.4.131/repo/ is the real offline repository."""
    repo = cuda_offline_repo()
    files = {f"cuda/{CUDA_VERSION_FULL}/repo/{p.name}": p for p in sorted(repo.iterdir()) if p.is_file()}
    return write_bundle(bundle, files, {"cuda": CUDA_VERSION_FULL})


def driver_bundle(bundle: Path, version: str) -> Path:
    """A bundle whose nvidia_driver/NVIDIA-Linux-x86_64-<version>.run is the installer TEST DOUBLE."""
    return write_bundle(
        bundle, {f"nvidia_driver/NVIDIA-Linux-x86_64-{version}.run": DOUBLE}, {"nvidia_driver": version}
    )


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "cuda-bundle":
        print(cuda_bundle(Path(argv[1])))
        return 0
    if len(argv) == 3 and argv[0] == "driver-bundle":
        print(driver_bundle(Path(argv[1]), argv[2]))
        return 0
    print("usage: gpu_roles_support.py cuda-bundle DIR | driver-bundle DIR VERSION", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
