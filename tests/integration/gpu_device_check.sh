#!/usr/bin/env bash
# Runs on the GPU machine (device tool): ansible-core from carried wheels (.whl), then the nvidia_driver role
# with -c local against the real driver. Output goes to stdout and $OUT/device.log.
set -u
log=${OUT:-/tmp}/device.log
exec > >(tee "$log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
export ANSIBLE_ROLES_PATH=$PWD/roles ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 ANSIBLE_PYTHON_INTERPRETER=$(command -v python3)
play=tests/integration/gpu_driver_play.yml
run() { echo; echo "===== $*"; timeout 120 ansible-playbook -i localhost, -c local "$@" 2>&1 | sed -n '/^TASK \[nvidia_driver : Report what was found/,/^$/p;/^TASK \[nvidia_driver : Report the driver/,/^$/p;/fatal:/,/^$/p;/PLAY RECAP/,$p'; }

echo "===== machine"; uname -r; grep PRETTY /etc/os-release; python3 --version; ansible-playbook --version | head -1
echo "===== /proc/driver/nvidia/version"; cat /proc/driver/nvidia/version
echo "===== nvidia-smi"; command -v nvidia-smi; nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader; nvidia-smi | head -4
echo "===== NVIDIA PCI functions (vendor 0x10de)"; for d in /sys/bus/pci/devices/*; do [ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] && echo "${d##*/} $(cat $d/class)"; done
echo "===== NVSwitch nodes"; ls /dev/nvidia-nvswitch* 2>&1 | head -3; nvidia-smi nvlink --status 2>&1 | head -5
installed=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
echo "installed driver: $installed"

run "$play" -e nvidia_driver_version="$installed" -e nvidia_driver_branch="${installed%%.*}" -e nvidia_driver_persistence_mode=false
run "$play" --check --diff -e nvidia_driver_version="$installed" -e nvidia_driver_branch="${installed%%.*}"
run "$play" -e nvidia_driver_version=550.163.01 -e nvidia_driver_branch=550 -e nvidia_driver_allow_change=false
printf 'placeholder, never run\n' >/tmp/NVIDIA-Linux-x86_64-550.163.01.run
sum=$(sha256sum /tmp/NVIDIA-Linux-x86_64-550.163.01.run | cut -d' ' -f1)
run "$play" --check --tags nvidia_driver_preflight -e nvidia_driver_version=550.163.01 -e nvidia_driver_branch=550 \
  -e nvidia_driver_runfile_src=/tmp/NVIDIA-Linux-x86_64-550.163.01.run -e nvidia_driver_runfile_sha256="$sum"
exit 0
