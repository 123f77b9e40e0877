"""Print the download URLs of the wheels to carry: pip's --report of vLLM, less what the GPU machine has.

The machine's packages are in machine-packages.txt (the device tool's KINDS.md, "Python packages already
there", read 2026-11-17); stand-in wheels (version "+dummy") and the kernel packages vLLM starts without
are left out too.
Usage: python3 payload_urls.py REPORT_JSON
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

MACHINE = Path(__file__).with_name("machine-packages.txt")
SKIP = {"fastsafetensors", "quack-kernels", "nvidia-cudnn-frontend", "vllm"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> None:
    report = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    lines = MACHINE.read_text(encoding="utf-8").splitlines()
    leave_out = {norm(x) for x in lines if x and not x.startswith("#")} | SKIP
    for item in report["install"]:
        meta = item["metadata"]
        if "+dummy" not in meta["version"] and norm(meta["name"]) not in leave_out:
            print(item["download_info"]["url"])


if __name__ == "__main__":
    main()
