#!/bin/bash
# On the GPU machine (device tool), from the repo root. The vLLM payload (shared/gpu.md recipe) arrives as
# .gpu/p0 .gpu/p1 ..., one per call; each call appends what it carries to /root/stash.
#   tests/gpu/device_run.sh stash              store the carried part(s) and stop
#   tests/gpu/device_run.sh setup              also unpack the payload and build the model dir
#   tests/gpu/device_run.sh run SHAPE...       also run mp_runner.py on those shapes of .gpu/rendered
#   tests/gpu/device_run.sh services [PHASE...]  also run services_runner.py on .gpu/services (two replicas
#                                              behind vllm-router; the payload built with EXTRA="vllm-router==0.1.17
#                                              orjson"), every phase or those named
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}
mkdir -p /root/stash "$out"
for part in "$repo"/.gpu/p[0-9]; do
  if [ -f "$part" ]; then cp "$part" /root/stash/; fi
done
ls -l /root/stash
[ "${1:-}" = stash ] && exit 0
action=${1:-setup}
shift || true
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
model=/root/gpufleet-model/Qwen2.5-1.5B-Instruct
if [ ! -f /root/site/.unpacked ] || [ ! -f "$model/tokenizer.json" ]; then # a later call on a warm machine skips this
  cd /root/stash
  cat p[0-9] >payload.tar.xz
  sha256sum -c "$repo/.gpu/payload.sha256"
  python3 "$repo/tests/gpu/mkmodel.py" "$repo/models/Qwen2.5-1.5B-Instruct/config.json" "$model" >"$out/mkmodel.log" 2>&1 &
  mkdir -p /root/site
  if command -v xz >/dev/null; then
    tar -xJf payload.tar.xz -C /root/site
  else
    python3 -c "import tarfile; tarfile.open('payload.tar.xz').extractall('/root/site')"
  fi
  wait $! || { cat "$out/mkmodel.log"; exit 1; }
  cat "$out/mkmodel.log"
  touch /root/site/.unpacked
fi
echo "setup took $(($(date +%s) - t0)) s"
cd "$repo"
export PYTHONPATH=/root/site HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.device_count(), 'GPUs')"
case $action in
  run) python3 tests/gpu/mp_runner.py "$repo/.gpu/rendered" "$out" "$@" ;;
  services) python3 tests/gpu/services_runner.py "$repo/.gpu/services" "$out" "$@" ;;
esac
