#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repo root: ansible-core from carried wheels (.whl), then with
# -c local against the real driver and GPU(s):
#  1. the nvidia_driver role alone (gpu_driver_play.yml): pinned to the loaded driver, in check mode, another
#     pin refused (allow_change false), another pin's preflight in check mode;
#  2. the preflight role's GPU checks and the nvidia_driver role together (gpu_preflight_play.yml, issue 11):
#     the facts nvidia_driver_installed_version, nvidia_driver_cuda_version and preflight_gpus (count, names)
#     must equal what nvidia-smi says; the same in check mode; a declared model given as one lower-case word of
#     nvidia-smi's name passes; a wrong gpufleet_gpu_model and a wrong gpufleet_gpu_count must each be refused
#     with their one-line message; without nvidia-smi on PATH the lspci fallback runs (reported, not judged).
# Output goes to stdout and $OUT/device.log; PASS/FAIL lines also to $OUT/summary.txt. Exit status 1 if a
# check failed. GPU_CHECK_DRIVER_ONLY=1 runs part 1 only.
set -u
out=${OUT:-/tmp}
log=$out/device.log
exec > >(tee "$log") 2>&1
# GPU_CHECK_REHEARSAL=FILE (a CPU rehearsal only): the ansible-playbook already on PATH, and -e @FILE on every
# run (the nvidia_driver role's detection pointed at test doubles).
if [ -z "${GPU_CHECK_REHEARSAL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
export ANSIBLE_ROLES_PATH=$PWD/roles ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 ANSIBLE_PYTHON_INTERPRETER=$(command -v python3)
play=tests/integration/gpu_driver_play.yml
rehearse=()
[ -z "${GPU_CHECK_REHEARSAL:-}" ] || rehearse=(-e "@$GPU_CHECK_REHEARSAL")
run() { echo; echo "===== $*"; timeout 120 ansible-playbook -i localhost, -c local "${rehearse[@]}" "$@" 2>&1 | sed -n '/^TASK \[nvidia_driver : Report what was found/,/^$/p;/^TASK \[nvidia_driver : Report the driver/,/^$/p;/fatal:/,/^$/p;/PLAY RECAP/,$p'; }
failed=0
verdict() { # verdict LABEL OK(0/1) DETAIL
  local word=PASS
  [ "$2" = 0 ] || { word=FAIL; failed=1; }
  echo "$word: $1 -- $3" | tee -a "$out/summary.txt"
}

echo "===== machine"; uname -r; grep PRETTY /etc/os-release; python3 --version; ansible-playbook --version | head -1
echo "===== /proc/driver/nvidia/version"; cat /proc/driver/nvidia/version
echo "===== nvidia-smi"; command -v nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,pci.bus_id --format=csv,noheader; nvidia-smi | head -4
echo "===== NVIDIA PCI functions (vendor 0x10de)"; for d in /sys/bus/pci/devices/*; do [ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] && echo "${d##*/} $(cat $d/class)"; done
echo "===== lspci"; command -v lspci || echo "no lspci on this machine"
echo "===== NVSwitch nodes"; ls /dev/nvidia-nvswitch* 2>&1 | head -3; nvidia-smi nvlink --status 2>&1 | head -5
installed=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
echo "installed driver: $installed"
pin=(-e nvidia_driver_version="$installed" -e nvidia_driver_branch="${installed%%.*}" -e nvidia_driver_persistence_mode=false)
pin+=("${rehearse[@]}")

# 1. The nvidia_driver role alone (as measured before, roles/nvidia_driver/README.md, Testing)
run "$play" "${pin[@]}"
run "$play" --check --diff -e nvidia_driver_version="$installed" -e nvidia_driver_branch="${installed%%.*}"
run "$play" -e nvidia_driver_version=550.163.01 -e nvidia_driver_branch=550 -e nvidia_driver_allow_change=false
printf 'placeholder, never run\n' >/tmp/NVIDIA-Linux-x86_64-550.163.01.run
sum=$(sha256sum /tmp/NVIDIA-Linux-x86_64-550.163.01.run | cut -d' ' -f1)
run "$play" --check --tags nvidia_driver_preflight -e nvidia_driver_version=550.163.01 -e nvidia_driver_branch=550 \
  -e nvidia_driver_runfile_src=/tmp/NVIDIA-Linux-x86_64-550.163.01.run -e nvidia_driver_runfile_sha256="$sum"
[ -z "${GPU_CHECK_DRIVER_ONLY:-}" ] || exit 0

# 2. The preflight GPU checks with the driver role (issue 11)
pre=tests/integration/gpu_preflight_play.yml
mapfile -t names < <(nvidia-smi --query-gpu=name --format=csv,noheader)
count=${#names[@]}
name=${names[0]}
cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
word=$(printf '%s' "$name" | awk '{print tolower($2)}') # "NVIDIA H100 80GB HBM3" -> h100
wrong_model="NVIDIA H800"
case "$name" in *H800*) wrong_model="NVIDIA H200" ;; esac
echo "nvidia-smi: $count GPU(s), first '$name', driver $installed, CUDA $cuda; model word for the lower-case run: $word"
# play LABEL ARGS...: runs the play, keeps its whole output in $out/preflight-LABEL.log, sets $rc and $said
# (the output with whitespace runs folded to one space, so that wrapped messages can be searched)
play() {
  local label=$1
  shift
  echo
  echo "===== preflight $label: $*"
  timeout 180 ansible-playbook -i localhost, -c local "$pre" "$@" >"$out/preflight-$label.log" 2>&1
  rc=$?
  said=$(tr -s ' \n' '  ' <"$out/preflight-$label.log")
  sed -n '/preflight : Report/,/^$/p;/nvidia_driver : Report the driver/,/^$/p;/fatal:/,/^$/p;/PLAY RECAP/,$p' \
    "$out/preflight-$label.log"
}

rm -f /tmp/gpu11-facts.json
play right "${pin[@]}" -e "gpufleet_gpu_model='$name'" -e gpufleet_gpu_count="$count" -e gpu_facts_file=/tmp/gpu11-facts.json
cp /tmp/gpu11-facts.json "$out/facts.json" 2>/dev/null
cat "$out/facts.json" 2>/dev/null
compared=$(python3 - "$out/facts.json" "$installed" "$cuda" "$count" "${names[@]}" <<'PY'
import json, sys
try:
    facts = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"no facts ({e})"); sys.exit(1)
installed, cuda, count, names = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
gpus = facts.get("preflight_gpus") or {}
pairs = [("nvidia_driver_installed_version", facts.get("nvidia_driver_installed_version"), installed),
         ("nvidia_driver_cuda_version", facts.get("nvidia_driver_cuda_version"), cuda),
         ("preflight_gpus.count", gpus.get("count"), count),
         ("preflight_gpus.names", gpus.get("names"), names),
         ("preflight_gpus.driver_versions", gpus.get("driver_versions"), [installed]),
         ("preflight_gpus.source", gpus.get("source"), "nvidia-smi")]
print("; ".join(f"{k}={got!r} (nvidia-smi {want!r}{'' if got == want else ', DIFFERENT'})" for k, got, want in pairs))
sys.exit(0 if all(got == want for _, got, want in pairs) else 1)
PY
)
ok=$?
[ "$rc" = 0 ] || ok=1
verdict "preflight GPU checks + nvidia_driver facts equal nvidia-smi (play rc=$rc)" "$ok" "$compared"

play check --check "${pin[@]}" -e "gpufleet_gpu_model='$name'" -e gpufleet_gpu_count="$count"
[[ $said == *"failed=0"* && $said == *"changed=0"* ]]
verdict "the same in check mode: failed=0 changed=0 (play rc=$rc)" $? "$(grep -o 'localhost *: ok=.*' "$out/preflight-check.log")"

play word -e gpu_check_driver=false -e gpufleet_gpu_model="$word" -e gpufleet_gpu_count="$count"
[ "$rc" = 0 ]
verdict "gpufleet_gpu_model='$word' (one lower-case word of '$name') accepted (play rc=$rc)" $? "$(grep -o 'localhost *: ok=.*' "$out/preflight-word.log")"

play wrong-model -e gpu_check_driver=false -e "gpufleet_gpu_model='$wrong_model'" -e gpufleet_gpu_count="$count"
msg=$(grep -oP "host localhost: nvidia-smi names .*?put the host in the group whose GPUs it has\." <<<"$said" | head -1)
[[ $rc != 0 && $msg == *"gpufleet_gpu_model=\"$wrong_model\""* && $msg == *"Fix: set gpufleet_gpu_model: \"$name\""* ]]
verdict "gpufleet_gpu_model='$wrong_model' refused (play rc=$rc)" $? "${msg:-no refusal message}"

play wrong-count -e gpu_check_driver=false -e "gpufleet_gpu_model='$name'" -e gpufleet_gpu_count=$((count + 1))
msg=$(grep -oP "host localhost: found $count NVIDIA GPU\(s\) .*?\(nvidia-smi -L\)\." <<<"$said" | head -1)
[[ $rc != 0 && $msg == *"declares gpufleet_gpu_count=$((count + 1))."* && $msg == *"Fix: set gpufleet_gpu_count: $count "* ]]
verdict "gpufleet_gpu_count=$((count + 1)) refused (play rc=$rc)" $? "${msg:-no refusal message}"

# Without nvidia-smi on PATH (as before the driver is installed): the lspci fallback, or its own refusal when
# the machine has no lspci. Reported only: which it is depends on the machine's packages.
smi_dir=$(dirname "$(command -v nvidia-smi)")
nosmi_path=$(tr ':' '\n' <<<"$PATH" | grep -vx "$smi_dir" | paste -sd:)
if [ "$smi_dir" = /usr/bin ] || [ "$smi_dir" = /bin ] || PATH=$nosmi_path command -v nvidia-smi >/dev/null; then
  echo "INFO: nvidia-smi ($smi_dir) cannot be taken off PATH alone; the lspci fallback was not run" | tee -a "$out/summary.txt"
else
  PATH=$nosmi_path play no-smi -e gpu_check_driver=false -e "gpufleet_gpu_model='$wrong_model'" -e gpufleet_gpu_count="$count"
  msg=$(grep -o "host localhost: nvidia-smi not installed: counted.*until a driver answers\|host localhost: cannot count its GPUs.*for this host\." <<<"$said")
  echo "INFO: without nvidia-smi on PATH (play rc=$rc): ${msg:-$(grep -o 'localhost *: ok=.*' "$out/preflight-no-smi.log")}" | tee -a "$out/summary.txt"
fi
exit $failed
