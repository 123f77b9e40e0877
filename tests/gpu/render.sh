#!/bin/bash
# Render the role's config for the two-node inventory twice (TP 2 x PP 1, and TP 1 x PP 2) into .gpu/rendered,
# the folder the device calls carry. Run from anywhere; uses the repo's venv and ansible.cfg.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/.gpu/rendered
mkdir -p "$out/tp2" "$out/pp2"
cd "$repo"
for shape in "tp2 2 1" "pp2 1 2"; do
  set -- $shape
  PATH=$repo/.venv/bin:$PATH ansible-playbook -i tests/gpu/inventory.yml tests/gpu/render.yml \
    -e "gpu_render_dir=$out/$1 vllm_service_tensor_parallel_size=$2 vllm_service_pipeline_parallel_size=$3" \
    -e "vllm_service_api_key_file=$out/gpufleet.apikey ansible_python_interpreter=$repo/.venv/bin/python"
done
head -n 100 "$out"/*/*.yaml
