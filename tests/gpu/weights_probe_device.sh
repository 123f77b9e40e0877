#!/bin/bash
# On the one-GPU machine (device tool), from the repo root: what vLLM 0.24's "Model loading took" is made of
# (weights_probe.py). The payload of build_payload.sh arrives as for pd_device_run.sh, split into 60 MB parts
# .gpu/pd/q0 .. q3 (p0 alone plus the working tree is over the 64 MiB a call carries), one per call; each call
# appends what it carries to /root/stash.
#   tests/gpu/weights_probe_device.sh stash        store the carried part(s) and stop
#   tests/gpu/weights_probe_device.sh run [CASE]   also unpack the payload (once per machine), run the probe
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}
mkdir -p /root/stash "$out"
for part in "$repo"/.gpu/pd/q[0-9]; do
  if [ -f "$part" ]; then cp "$part" /root/stash/; fi
done
ls -l /root/stash
[ "${1:-}" = stash ] && exit 0
shift
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
if [ ! -f /root/site/.unpacked ]; then # a later call on a warm machine skips this
  cd /root/stash
  cat q0 q1 q2 q3 >payload.tar.xz
  sha256sum -c "$repo/.gpu/pd/payload.sha256"
  mkdir -p /root/site
  tar -xJf payload.tar.xz -C /root/site
  rm -f payload.tar.xz
  touch /root/site/.unpacked
fi
echo "setup took $(($(date +%s) - t0)) s"
cd "$repo"
export PYTHONPATH=/root/site HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
python3 -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
python3 tests/gpu/weights_probe.py "$out" --budget "${PROBE_BUDGET:-520}" "$@"
