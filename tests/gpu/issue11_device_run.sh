#!/bin/bash
# Issue 11 on one GPU (device tool, nvidia-h100-x1 or nvidia-h200), from the repo root, in the call after the
# four `ray_device_run.sh stash` calls; carries .whl, .gpu16/rendered and .gpu16/payload.sha256.
#  (a) tests/integration/gpu_device_check.sh: the nvidia_driver role and the preflight GPU checks with
#      ansible-playbook -c local against the real driver and GPU (facts = nvidia-smi; wrong model/count refused);
#  (b) tests/gpu/ray_device_run.sh run tp1ray tp1: a Ray head from the ray_cluster unit's flags, then
#      `vllm serve --config head.yaml` with the head's env, for the role's TP 1 config with
#      distributed-executor-backend: ray (tp1ray) and as the role renders world size 1 (tp1, no executor named);
#  (c) per shape, tests/gpu/vllm_facts_check.py: the role's gpufleet_vllm_facts on the real log against the log.
# Everything lands in $OUT: summary.txt (PASS/FAIL lines), device_run.log (if tee'd), device.log and
# preflight-*.log (a), ray-head.log, SHAPE-vllm.log, SHAPE-metrics.txt, bench.log (b), SHAPE-facts.txt (c).
# Ends within GPU11_LIMIT seconds (550: the call's limit is 600).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}
limit=${GPU11_LIMIT:-550}
t0=$(date +%s)
mkdir -p "$out"
cd "$repo"
echo "=== (a) nvidia_driver + preflight GPU checks, ansible-playbook -c local" | tee -a "$out/summary.txt"
timeout 200 bash tests/integration/gpu_device_check.sh
a=$?
echo "(a) exit $a after $(($(date +%s) - t0)) s" | tee -a "$out/summary.txt"
echo "=== (b) Ray head + vLLM with the rendered TP 1 configuration" | tee -a "$out/summary.txt"
RAY16_LIMIT=$((limit - ($(date +%s) - t0) - 15)) tests/gpu/ray_device_run.sh run tp1ray tp1
b=$?
echo "(b) exit $b after $(($(date +%s) - t0)) s" | tee -a "$out/summary.txt"
c=0
for shape in tp1ray tp1; do
  ready=$(sed -n "s/^=== $shape: [A-Z]* (ready \([0-9.]*\) s)$/\1/p" "$out/summary.txt" | tail -1)
  echo "=== (c) $shape: gpufleet_vllm_facts against the log (runner's ready: ${ready:-none} s)" | tee -a "$out/summary.txt"
  if [ -s "$out/$shape-vllm.log" ] && [ -n "$ready" ]; then
    PYTHONPATH=/root/site:/tmp/site python3 tests/gpu/vllm_facts_check.py "$out/$shape-vllm.log" \
      ".gpu16/rendered/$shape/head.yaml" "$ready" ray >"$out/$shape-facts.txt" 2>&1 || c=1
    tee -a "$out/summary.txt" <"$out/$shape-facts.txt"
  else
    echo "FAIL: no vLLM log or no ready time for $shape" | tee -a "$out/summary.txt"
    c=1
  fi
done
echo "=== issue 11 on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1): (a) exit $a, (b) exit $b, (c) exit $c; $(($(date +%s) - t0)) s" | tee -a "$out/summary.txt"
[ "$a$b$c" = 000 ]
