"""TEST DOUBLE of NVIDIA's container toolkit packages, for the lab.

Debian (bookworm and trixie, main/contrib/non-free) does not package nvidia-container-toolkit or
libnvidia-container, and the lab may download nothing else, so the real packages cannot reach a lab host.
These four .debs carry the real package names, versions, file names and dependencies, so the role's
bundle lookup, sha256 verification, dependency-ordered install, idempotence and version checks run for
real. Their programs are stand-ins: ``nvidia-ctk --version`` prints the version, and
``nvidia-container-runtime`` hands every call to runc, as the real runtime does for a container that asks
for no GPU. Each package's description starts with "TEST DOUBLE". The real packages are verified on a GPU
host only.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from docker_tarball import add_to_lock, cache_root

from gpufleet.lab.system import file_lock

VERSION = "1.17.4"  # the role default, as offline_bundle/manifest.yml pins it
RELEASE = "1"
DEB_VERSION = f"{VERSION}-{RELEASE}"

RUNTIME = """#!/bin/sh
# TEST DOUBLE of nvidia-container-runtime: no GPU is asked for, so runc does the work.
exec runc "$@"
"""
CTK = f"""#!/bin/sh
# TEST DOUBLE of nvidia-ctk (gpufleet tests).
case "$1" in
  --version|-v) echo "NVIDIA Container Toolkit CLI version {VERSION}"; echo "commit: test-double" ;;
  *) echo "nvidia-ctk TEST DOUBLE: $* is not implemented" >&2; exit 1 ;;
esac
"""
HOOK = "#!/bin/sh\n# TEST DOUBLE of nvidia-container-runtime-hook (gpufleet tests).\nexit 0\n"
CLI = f'#!/bin/sh\n# TEST DOUBLE of nvidia-container-cli (gpufleet tests).\necho "cli-version: {VERSION}"\n'


@dataclass(frozen=True)
class DoublePackage:
    name: str
    depends: str
    files: dict[str, str]  # path inside the package -> content (executables)


PACKAGES = (
    DoublePackage("libnvidia-container1", "libc6", {}),
    DoublePackage(
        "libnvidia-container-tools",
        f"libnvidia-container1 (= {DEB_VERSION})",
        {"usr/bin/nvidia-container-cli": CLI},
    ),
    DoublePackage(
        "nvidia-container-toolkit-base",
        "",
        {"usr/bin/nvidia-ctk": CTK, "usr/bin/nvidia-container-runtime": RUNTIME},
    ),
    DoublePackage(
        "nvidia-container-toolkit",
        f"nvidia-container-toolkit-base (= {DEB_VERSION}), libnvidia-container-tools (>= {DEB_VERSION})",
        {"usr/bin/nvidia-container-runtime-hook": HOOK},
    ),
)


def _build(package: DoublePackage, dest: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="nct-double-") as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        control = [
            f"Package: {package.name}",
            f"Version: {DEB_VERSION}",
            "Architecture: amd64",
            "Maintainer: gpufleet tests <tests@gpufleet.invalid>",
            *([f"Depends: {package.depends}"] if package.depends else []),
            f"Description: TEST DOUBLE of NVIDIA's {package.name} (gpufleet lab tests)",
            " Stand-in with the real name, version and dependencies; not NVIDIA software.",
        ]
        (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
        doc = root / "usr/share/doc" / package.name
        doc.mkdir(parents=True)
        (doc / "TEST-DOUBLE").write_text("Not NVIDIA software: a gpufleet test double.\n")
        for inner, content in package.files.items():
            path = root / inner
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            path.chmod(0o755)
        deb = dest / f"{package.name}_{DEB_VERSION}_amd64.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
            check=True,
            capture_output=True,
        )
        return deb


def build_double_debs() -> list[Path]:
    """The four test-double .debs (cached), in install order."""
    folder = cache_root().parent / "nvidia-container-toolkit-double" / DEB_VERSION
    with file_lock(folder.with_suffix(".lock")):
        debs = [folder / f"{package.name}_{DEB_VERSION}_amd64.deb" for package in PACKAGES]
        if all(deb.is_file() for deb in debs):
            return debs
        folder.mkdir(parents=True, exist_ok=True)
        return [_build(package, folder) for package in PACKAGES]


def add_to_bundle(bundle: Path) -> list[Path]:
    """Copy the doubles into ``bundle``/nvidia_container_toolkit/<version>/ and record them in its lock."""
    target = bundle / "nvidia_container_toolkit" / VERSION
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for deb in build_double_debs():
        dest = target / deb.name
        shutil.copyfile(deb, dest)
        copied.append(dest)
    source = "TEST DOUBLE (tests/integration/nvidia_toolkit_double.py), not NVIDIA software"
    add_to_lock(bundle, {str(path.relative_to(bundle)): (VERSION, source) for path in copied})
    return copied


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, required=True, help="bundle to add the test doubles to")
    for path in add_to_bundle(parser.parse_args().bundle):
        print(path)
