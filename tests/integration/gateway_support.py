"""vllm-router's pinned wheel for the gateway tests (issue 35), from PyPI into the cache once.

The pin (docs/gateway.md names it too): the wheel's file name and its sha256, checked after every download and
by the gateway role before it copies the wheel anywhere.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

from conftest import VENV_BIN

ROUTER_WHEEL = "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl"
ROUTER_SHA256 = "85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d"
CACHE = Path.home() / ".cache" / "gpufleet" / "wheels"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def router_wheel() -> Path:
    """The pinned wheel in the cache (downloaded aside, then renamed: a reader never sees half a file)."""
    wheel = CACHE / ROUTER_WHEEL
    if not wheel.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE, prefix=".download-") as fresh:
            subprocess.run(
                [str(VENV_BIN / "pip"), "download", "--quiet", "--no-deps", "--only-binary=:all:",
                 "--platform", "manylinux_2_28_x86_64", "--dest", fresh, "vllm-router==0.1.17"],
                check=True, timeout=600,
            )  # fmt: skip
            (Path(fresh) / ROUTER_WHEEL).rename(wheel)
    found = sha256(wheel)
    assert found == ROUTER_SHA256, f"{wheel}: sha256 {found}, pinned {ROUTER_SHA256}"
    return wheel
