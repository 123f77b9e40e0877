#!/bin/bash
# Render the vllm_pd role's files for the one-GPU 1P1D inventory (pd_inventory.yml) into .gpu/pd/rendered, the
# folder the device call carries. Run from anywhere; uses the repo's venv and ansible.cfg.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/.gpu/pd/rendered
mkdir -p "$out"
cd "$repo"
PATH=$repo/.venv/bin:$PATH ansible-playbook -i tests/gpu/pd_inventory.yml tests/gpu/pd_render.yml \
  -e "gpu_render_dir=$out vllm_pd_api_key_file=$out/gpufleet.apikey ansible_python_interpreter=$repo/.venv/bin/python"
head -n 100 "$out"/*.yaml "$out"/pd-proxy.json
