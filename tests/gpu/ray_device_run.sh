#!/bin/bash
# On the GPU machine (device tool), from the repo root. The payload (ray_build_payload.sh) arrives one part per
# call: .gpu16/p0 p1 p2 (vLLM) and .gpu16/p3 (Ray); each call stores what it carries in /root/stash.
#   tests/gpu/ray_device_run.sh stash          store the carried part(s) and stop
#   tests/gpu/ray_device_run.sh run SHAPE...   also check and unpack the payload, build the model dir, and run
#                                              ray_runner.py on .gpu16/rendered (ends within RAY16_LIMIT s;
#                                              RAY16_REHEARSAL=1 skips the vLLM import check: a CPU rehearsal)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}
limit=${RAY16_LIMIT:-560}
t0=$(date +%s)
mkdir -p /root/stash "$out"
for part in "$repo"/.gpu16/p[0-9]; do
  if [ -f "$part" ]; then cp "$part" /root/stash/; fi
done
ls -l /root/stash
[ "${1:-}" = run ] || exit 0
shift
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader
model=/root/gpufleet-model/Qwen2.5-1.5B-Instruct
if [ ! -f /root/site/.ray16-unpacked ] || [ ! -f "$model/tokenizer.json" ]; then # a later call on a warm machine skips this
  cd /root/stash
  [ -f payload.tar.xz ] || cat p0 p1 p2 >payload.tar.xz
  sha256sum -c "$repo/.gpu16/payload.sha256"
  python3 "$repo/tests/gpu/mkmodel.py" "$repo/models/Qwen2.5-1.5B-Instruct/config.json" "$model" >/tmp/mkmodel.log 2>&1 &
  mkmodel=$!
  unpack=()
  mkdir -p /root/site
  for part in payload.tar.xz p3; do # vLLM and Ray hold disjoint files: unpack both at once
    if command -v xz >/dev/null; then
      tar -xJf $part -C /root/site &
    else
      python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('/root/site')" $part &
    fi
    unpack+=($!)
  done
  for pid in "${unpack[@]}"; do wait "$pid"; done
  wait $mkmodel || { cat /tmp/mkmodel.log; exit 1; }
  cat /tmp/mkmodel.log
  touch /root/site/.ray16-unpacked
fi
echo "setup took $(($(date +%s) - t0)) s"
cd "$repo"
export PYTHONPATH=/root/site HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export RAY_USAGE_STATS_ENABLED=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -n "${RAY16_REHEARSAL:-}" ] || python3 -c "import vllm, torch, ray; print('vllm', vllm.__version__, 'torch', torch.__version__, 'ray', ray.__version__, torch.cuda.device_count(), 'GPUs; CUDA total GiB', torch.cuda.mem_get_info(0)[1] / 2**30)"
python3 tests/gpu/ray_runner.py "$repo/.gpu16/rendered" "$out" --deadline $((limit - $(date +%s) + t0)) "$@"
