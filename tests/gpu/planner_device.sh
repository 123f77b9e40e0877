#!/bin/bash
# On the GPU machine (device tool), from the repo root: the planner's ground truth. The payload parts arrive
# as for device_run.sh (`tests/gpu/device_run.sh stash`, one part per call); this unpacks them (once per
# machine) and starts real vLLM 0.24 once per planner case (planner_run.py), logs into $OUT.
#   tests/gpu/planner_device.sh [--budget S] [CASE ...]
# PARTS (default REPO/.gpu) is where the carried parts and payload.sha256 are: a helper in another worktree
# carries them, with a copy of tests/, in an ignored folder of the session's checkout (the device tool sends
# that checkout, not the worktree).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
parts=${PARTS:-$repo/.gpu}
out=${OUT:-/tmp/out}
mkdir -p /root/stash "$out"
for part in "$parts"/p[0-9]; do
  if [ -f "$part" ]; then cp "$part" /root/stash/; fi
done
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
if [ ! -f /root/site/.unpacked ]; then
  cd /root/stash
  cat p[0-9] >payload.tar.xz  # p0 p1 p2 (xz -6) or more parts (a faster, larger xz)
  sha256sum -c "$parts/payload.sha256"
  mkdir -p /root/site
  if command -v xz >/dev/null; then tar -xJf payload.tar.xz -C /root/site
  else python3 -c "import tarfile; tarfile.open('payload.tar.xz').extractall('/root/site')"; fi
  touch /root/site/.unpacked
fi
echo "setup took $(($(date +%s) - t0)) s"
cd "$repo"
export PYTHONPATH=/root/site HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.mem_get_info())"
python3 tests/gpu/planner_run.py "$out" "$@"
