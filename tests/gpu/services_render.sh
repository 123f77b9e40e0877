#!/bin/bash
# Render two replicas of one service (instances r0 and r1, ports 8101 and 8102) on one node with the role's
# templates (render.yml) into .gpu/services/r0 and .gpu/services/r1, the folder `device_run.sh services` reads.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/.gpu/services
mkdir -p "$out"
cd "$repo"
for replica in "r0 8101" "r1 8102"; do
  set -- $replica
  mkdir -p "$out/$1"
  PATH=$repo/.venv/bin:$PATH ansible-playbook -i tests/gpu/services_inventory.yml tests/gpu/render.yml \
    -e "gpu_render_dir=$out/$1 vllm_service_instance_id=$1 vllm_service_port=$2" \
    -e "vllm_service_api_key_file=$out/gpufleet.apikey ansible_python_interpreter=$repo/.venv/bin/python"
done
head -n 100 "$out"/*/*.yaml
