#!/bin/bash
# Build the vLLM payload for the GPU machine (the shared/gpu.md recipe): vllm 0.24.0 (it pins torch 2.11.0, the
# machine's) and the cp312 manylinux wheels of its dependencies that the machine lacks, installed into one
# site directory, pruned, packed with xz and split into parts under 61 MiB (.gpu/p0 p1 p2 + payload.sha256).
# Needs internet to PyPI and python3.12 (for pip --target). About 8 minutes here, most of it xz on 2 cores.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${WORK:-/root/gpub}
py312=${PY312:-python3.12}
mkdir -p "$work" && cd "$work"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 \
  manylinux2014 manylinux1; do plat+=(--platform "${p}_x86_64"); done
pip=("$repo/.venv/bin/pip" --isolated --cert /etc/ssl/certs/ca-certificates.crt)

"${pip[@]}" download --no-deps "${plat[@]}" -d vwheel vllm==0.24.0
# Stand-ins (no files, no requirements) for what the machine has (torch) or vLLM starts without (the FlashInfer,
# tilelang, quack, humming, tokenspeed kernel packages; VLLM_USE_FLASHINFER_SAMPLER=0), so pip resolves the rest.
"$py312" - <<'PY'
import os, zipfile
stand_ins = {"torch": "2.11.0", "torchaudio": "2.11.0", "torchvision": "0.26.0", "flashinfer-python": "0.6.12",
             "flashinfer-cubin": "0.6.12", "tilelang": "0.1.9", "nvidia-cudnn-frontend": "1.19.1",
             "fastsafetensors": "0.3.2", "nvidia-cutlass-dsl": "4.5.2", "quack-kernels": "0.3.3",
             "tokenspeed-mla": "0.1.2", "humming-kernels": "0.1.6", "numba": "0.65.0"}
os.makedirs("dummy", exist_ok=True)
for name, version in stand_ins.items():
    dist = f"{name.replace('-', '_')}-{version}+dummy"
    files = {f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}+dummy\nProvides-Extra: cu13\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{k},,\n" for k in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(f"dummy/{dist}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
PY
"${pip[@]}" install --dry-run --ignore-installed --report report.json "${plat[@]}" --find-links dummy --target /tmp/unused \
  vwheel/vllm-0.24.0-*.whl >/dev/null
# Keep what the machine lacks (its package list: the device tool's KINDS.md) and what is no stand-in.
"$py312" "$repo/tests/gpu/payload_urls.py" report.json >urls.txt
rm -rf wh site && mkdir wh
(cd wh && xargs -n 8 -P 4 curl -sSfL --remote-name-all <../urls.txt)
# EXTRA (e.g. "vllm-router==0.1.17 orjson" for services_runner.py): more cp312 wheels, without their dependencies
if [ -n "${EXTRA:-}" ]; then "${pip[@]}" download --no-deps "${plat[@]}" -d wh $EXTRA; fi
"$py312" -m pip install -q --no-index --no-deps --no-compile --target site wh/*.whl
unzip -q -o vwheel/vllm-0.24.0-*.whl -d site
# Not needed on an H200 (FA3 is used), or not for this Python.
rm -rf site/bin site/vllm/vllm-rs site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so site/xgrammar/lib/libxgrammar.a
find site/vllm/third_party/deep_gemm -name "_C.cpython-3*" ! -name "*312*" -delete
tar -C site -cf - . | xz -T2 -6 >payload.tar.xz
mkdir -p "$repo/.gpu" && rm -f "$repo"/.gpu/p[0-9]
split -b 61M -d -a 1 payload.tar.xz "$repo/.gpu/p"
sha256sum payload.tar.xz | sed 's#payload.tar.xz#/root/stash/payload.tar.xz#' >"$repo/.gpu/payload.sha256"
ls -l "$repo/.gpu"
