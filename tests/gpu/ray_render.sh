#!/bin/bash
# Render ray_inventory.yml with the roles' templates (ray_render.yml) twice, TP 2 x PP 1 and TP 1 x PP 2, into
# .gpu16/rendered/{tp2,pp2}/, the folder the device call carries. Uses the repo's venv and ansible.cfg.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${RAY_RENDER_OUT:-$repo/.gpu16/rendered}
mkdir -p "$out/tp2" "$out/pp2"
cd "$repo"
for shape in "tp2 2 1" "pp2 1 2"; do
  set -- $shape
  PATH=$repo/.venv/bin:$PATH ansible-playbook -i tests/gpu/ray_inventory.yml tests/gpu/ray_render.yml \
    -e "ray_render_dir=$out/$1 vllm_service_tensor_parallel_size=$2 vllm_service_pipeline_parallel_size=$3" \
    -e "vllm_service_api_key_file=$out/gpufleet.apikey ansible_python_interpreter=$repo/.venv/bin/python"
done
head -n 100 "$out"/tp2/*.ray.env "$out"/tp2/*.ray.service "$out"/*/head.yaml
