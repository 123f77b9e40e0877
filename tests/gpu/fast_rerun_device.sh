#!/usr/bin/env bash
# Issue 15 on one GPU (device tool, nvidia-h100-x1 or nvidia-h200), from the repo root, carrying .whl (ansible-core
# 2.19.14 and its wheels for Python 3.12, as for gpu_device_check.sh): the nvidia_driver role's fast re-run against
# the real driver, with -c local. The lab has no GPU, so only here do the role's fingerprint commands (the NVIDIA
# PCI functions, /proc/driver/nvidia/version, nvidia-smi's stable fields) meet real output:
#  1. GPUFLEET_FAST_RERUN=false: the whole role, pinned to the loaded driver (what every run did before);
#  2. the same with the fast re-run on: the whole role again (no stamp yet), then it records what it left;
#  3. again: the check must find the host in sync and skip the converge, and the facts the role publishes,
#     handed back by the stamp (tests/integration/gpu_preflight_play.yml writes them), must equal nvidia-smi's;
#  4. an input changed (nvidia_driver_reboot_timeout): the converge must run again, then a further run with that
#     input is in sync;
#  5. the fleet stamp of a whole deploy over that role stamp (see below). (The node state cannot be changed here: the GPU, its driver and nvidia-smi are the
#     machine's. The lab's end-to-end test puts a drifted file back, tests/unit/test_converged_module.py the rest.)
# PASS/FAIL lines go to $OUT/summary.txt, everything to $OUT/fast_rerun.log. Exit 1 if a check failed.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee "$out/fast_rerun.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
export ANSIBLE_ROLES_PATH=$PWD/roles ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 ANSIBLE_PYTHON_INTERPRETER=$(command -v python3)
installed=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
pin=(-e nvidia_driver_version="$installed" -e nvidia_driver_branch="${installed%%.*}" -e nvidia_driver_persistence_mode=false
  -e gpu_facts_file=/tmp/fast-facts.json -e gpufleet_gpu_count="$(nvidia-smi -L | wc -l)")
failed=0
verdict() { # verdict LABEL OK(0/1) DETAIL
  local word=PASS
  [ "$2" = 0 ] || { word=FAIL; failed=1; }
  echo "$word: $1 -- $3" | tee -a "$out/summary.txt"
}
# play LABEL [ENV=VALUE...] [-- ANSIBLE ARGS]: the play, its output in $out/fast-LABEL.log; sets $rc, $secs, $recap, $skipped_converge
play() {
  local label=$1 envs=() args=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift && args=("$@")
  local t0=$(date +%s.%N)
  env "${envs[@]}" timeout 180 ansible-playbook -i localhost, -c local tests/integration/gpu_preflight_play.yml \
    "${pin[@]}" "${args[@]}" >"$out/fast-$label.log" 2>&1
  rc=$?
  secs=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  recap=$(grep -o 'localhost *: ok=.*' "$out/fast-$label.log" | tr -s ' ')
  # The include of converge.yml: "skipping" under its task header when the check found the host in sync.
  skipped_converge=$(sed -n '/TASK \[nvidia_driver : Detect, install, configure and verify the driver\]/,/^$/p' \
    "$out/fast-$label.log" | grep -c '^skipping: \[localhost\]')
  echo "===== $label: rc=$rc, ${secs} s, converge skipped: $skipped_converge; $recap"
  sed -n '/nvidia_driver : Ask each host whether its driver/,/^$/p' "$out/fast-$label.log"
}
facts_equal() {
  python3 - /tmp/fast-facts.json "$installed" "$cuda" <<'PY'
import json, sys
facts = json.load(open(sys.argv[1]))
pairs = [("nvidia_driver_installed_version", sys.argv[2]), ("nvidia_driver_cuda_version", sys.argv[3])]
print("; ".join(f"{k}={facts.get(k)!r} (nvidia-smi {v!r})" for k, v in pairs))
sys.exit(0 if all(facts.get(k) == v for k, v in pairs) else 1)
PY
}

echo "===== machine"; uname -r; python3 --version; ansible-playbook --version | head -1; echo "driver $installed, CUDA $cuda"
rm -rf /var/lib/gpufleet/converged
play off GPUFLEET_FAST_RERUN=false
[ "$rc" = 0 ] && [ "$skipped_converge" = 0 ]
verdict "GPUFLEET_FAST_RERUN=false runs the whole role (${secs} s)" $? "$recap"
play first
[ "$rc" = 0 ] && [ "$skipped_converge" = 0 ] && [ -s /var/lib/gpufleet/converged/nvidia_driver.json ]
verdict "first run with the fast re-run: the whole role, then a stamp (${secs} s)" $? "$recap"
play second
said=$(facts_equal); same=$?
[ "$rc" = 0 ] && [ "$skipped_converge" = 1 ] && [ "$same" = 0 ]
verdict "second run: in sync, converge skipped, facts from the stamp equal nvidia-smi (${secs} s)" $? "$recap; $said"
play input -- -e nvidia_driver_reboot_timeout=901
[ "$rc" = 0 ] && [ "$skipped_converge" = 0 ]
verdict "an input changed (nvidia_driver_reboot_timeout): the converge runs again (${secs} s)" $? "$recap"
play after -- -e nvidia_driver_reboot_timeout=901
[ "$rc" = 0 ] && [ "$skipped_converge" = 1 ]
verdict "then in sync again (${secs} s)" $? "$recap"
cp /var/lib/gpufleet/converged/nvidia_driver.json "$out/stamp.json" 2>/dev/null

# 5. The whole deploy's fleet stamp (playbooks/fleet_check.yml) over the role stamp just recorded: the fleet check
#    runs the role's GPU commands again from the stamp's spec (nvidia-smi, /proc/driver/nvidia/version, lspci) in
#    one module call, and must find them in sync and hand back the facts; with the recorded nvidia-smi answer
#    altered (as a driver upgrade would change it) it must name nvidia_driver and drop the fleet stamp.
fleet() { # fleet STATE: the module as Ansible runs it (its arguments file); its JSON in /tmp/fleet-out.json, sets $fsecs
  python3 - "$1" >/tmp/fleet-args.json <<'PY'
import json, sys
print(json.dumps({"ANSIBLE_MODULE_ARGS": {"name": "fleet", "state": sys.argv[1], "digest": "f" * 64,
      "roles": ["nvidia_driver"], "commands": [["uname", "-r", "-m"], ["ip", "-br", "addr"]]}}))
PY
  local t0=$(date +%s.%N)
  python3 plugins/modules/gpufleet_converged.py /tmp/fleet-args.json >/tmp/fleet-out.json
  fsecs=$(python3 -c "import time; print(round(time.time() - $t0, 2))")
}
fleet fleet_record; echo "fleet_record (${fsecs} s): $(cat /tmp/fleet-out.json)"
fleet fleet_check; checked=$(cat /tmp/fleet-out.json); echo "fleet_check (${fsecs} s): $checked"
python3 - "$checked" "$installed" <<'PY'
import json, sys
result = json.loads(sys.argv[1])
sys.exit(0 if result["in_sync"] and result["ansible_facts"].get("nvidia_driver_installed_version") == sys.argv[2] else 1)
PY
verdict "fleet check over the role's stamp on the real GPU: in sync, facts handed back (${fsecs} s)" $? "$checked"
python3 - <<'PY'
import json
path = "/var/lib/gpufleet/converged/nvidia_driver.json"
stamp = json.load(open(path))
key = next(k for k in stamp["state"]["commands"] if "nvidia-smi" in k)
stamp["state"]["commands"][key] = "0 " + "0" * 64  # what another driver's nvidia-smi would have answered
json.dump(stamp, open(path, "w"))
PY
fleet fleet_check; drifted=$(cat /tmp/fleet-out.json); echo "fleet_check after the recorded nvidia-smi answer changed: $drifted"
echo "$drifted" | grep -q '"in_sync": false' && echo "$drifted" | grep -q 'fleet: nvidia_driver: ' \
  && [ ! -e /var/lib/gpufleet/converged/fleet.json ]
verdict "fleet check after nvidia-smi's answer differs: not in sync, names nvidia_driver, fleet stamp dropped" $? "$drifted"
exit $failed
