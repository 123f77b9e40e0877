#!/bin/bash
# On the one-GPU machine (device tool), from the repo root: a P/D service (1P1D) on one shared GPU.
# The vLLM payload of build_payload.sh arrives split again into 50 MB parts .gpu/pd/q0 .. q3 (p0 alone plus the
# working tree is over the 64 MiB a call carries), NIXL as .gpu/pd/nixl.tar.xz (nixl 1.5.1 + nixl_cu13, without
# nixl_ep and the headers) and vllm-router's wheel, one or two per call; each call adds what it carries to
# /root/stash.
#   tests/gpu/pd_device_run.sh stash     store the carried part(s) and stop
#   tests/gpu/pd_device_run.sh prepare   also unpack the payload (and NIXL if here), build the model dir
#   tests/gpu/pd_device_run.sh run       prepare, then pd_runner.py with .gpu/pd/rendered (pd_services_render.sh)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}
mkdir -p /root/stash "$out"
for part in "$repo"/.gpu/pd/q[0-9] "$repo"/.gpu/pd/nixl.tar.xz "$repo"/.gpu/pd/vllm_router-*.whl; do
  if [ -f "$part" ]; then cp "$part" /root/stash/; fi
done
ls -l /root/stash
[ "${1:-}" = stash ] && exit 0
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
model=/root/gpufleet-model/Qwen2.5-1.5B-Instruct
if [ ! -f /root/site/.unpacked ] || [ ! -f "$model/tokenizer.json" ]; then # a later call on a warm machine skips this
  cd /root/stash
  cat q[0-9] >payload.tar.xz
  sha256sum -c "$repo/.gpu/pd/payload.sha256"
  python3 "$repo/tests/gpu/mkmodel.py" "$repo/models/Qwen2.5-1.5B-Instruct/config.json" "$model" >"$out/mkmodel.log" 2>&1 &
  mkdir -p /root/site
  tar -xJf payload.tar.xz -C /root/site
  wait $! || { cat "$out/mkmodel.log"; exit 1; }
  cat "$out/mkmodel.log"
  rm -f payload.tar.xz
  touch /root/site/.unpacked
fi
if [ ! -f /root/site/.nixl ] && [ -f /root/stash/nixl.tar.xz ]; then
  tar -xJf /root/stash/nixl.tar.xz -C /root/site
  touch /root/site/.nixl
fi
# vllm-router's wheel (issue 39: its P/D mode in front of the same instances), unpacked as the gateway role does
if [ ! -f /root/router/.unpacked ] && ls /root/stash/vllm_router-*.whl >/dev/null 2>&1; then
  python3 -m zipfile -e /root/stash/vllm_router-*.whl /root/router && touch /root/router/.unpacked
fi
echo "setup took $(($(date +%s) - t0)) s"
cd "$repo"
export PYTHONPATH=/root/site HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.device_count(), 'GPU')"
if [ -f /root/site/.nixl ]; then
  python3 -c "import nixl, nixl_cu13; from nixl._api import nixl_agent; print('nixl from', nixl_cu13.__file__)"
  python3 -c "from importlib.metadata import version; print('nixl', version('nixl'), 'nixl_cu13', version('nixl_cu13'))"
fi
[ "${1:-}" = run ] || exit 0
python3 tests/gpu/pd_runner.py "$repo/.gpu/pd/rendered" "$out"
