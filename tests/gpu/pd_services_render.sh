#!/bin/bash
# Render a P/D service (pd_services_inventory.yml: 1 prefill, 1 decode on one node) with gpufleet's services
# path (pd_services_render.yml) into .gpu/pd/rendered, the folder pd_device_run.sh carries. Uses the repo's venv.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/.gpu/pd/rendered
rm -rf "$out" && mkdir -p "$out"
cd "$repo"
PATH=$repo/.venv/bin:$PATH ansible-playbook -i tests/gpu/pd_services_inventory.yml tests/gpu/pd_services_render.yml \
  -e "gpu_render_dir=$out vllm_service_api_key_file=$out/gpufleet.apikey ansible_python_interpreter=$repo/.venv/bin/python"
sed -i 's/10[.]0[.]0[.]1/127.0.0.1/g' "$out"/*.yaml "$out"/*.env "$out"/router.json  # the one machine's loopback
head -n 100 "$out"/*.yaml "$out"/router.json
