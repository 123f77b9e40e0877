#!/bin/bash
# Render the Ray executor's configuration with the roles' templates (ray_render.yml) into
# .gpu16/rendered/SHAPE/, the folder the device call carries. Shapes (default: tp2 pp2):
#   tp2  ray_inventory.yml (head + worker), TP 2 x PP 1     pp2  the same, TP 1 x PP 2
#   tp1  ray_inventory_tp1.yml (the head alone), TP 1 on one GPU (issue 11, single-GPU machines): as the role
#        renders world size 1, with no distributed-executor-backend, so vLLM runs its own executor
#   tp1ray  the same, plus distributed-executor-backend: ray through vllm_service_config (an inventory
#        setting): vLLM's Ray executor on the one GPU
# Uses the repo's venv and ansible.cfg. Usage: tests/gpu/ray_render.sh [SHAPE...]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${RAY_RENDER_OUT:-$repo/.gpu16/rendered}
cd "$repo"
[ $# -gt 0 ] || set -- tp2 pp2
for shape in "$@"; do
  case $shape in
    tp2) inventory=ray_inventory.yml tp=2 pp=1 ;;
    pp2) inventory=ray_inventory.yml tp=1 pp=2 ;;
    tp1 | tp1ray) inventory=ray_inventory_tp1.yml tp=1 pp=1 ;;
    *) echo "unknown shape $shape" >&2 && exit 2 ;;
  esac
  extra='{}'
  [ "$shape" != tp1ray ] || extra='{"vllm_service_config": {"load-format": "dummy", "distributed-executor-backend": "ray"}}'
  rm -rf "${out:?}/$shape" && mkdir -p "$out/$shape"
  PATH=$repo/.venv/bin:$PATH ansible-playbook -i "tests/gpu/$inventory" tests/gpu/ray_render.yml -e "$extra" \
    -e "ray_render_dir=$out/$shape vllm_service_tensor_parallel_size=$tp vllm_service_pipeline_parallel_size=$pp" \
    -e "vllm_service_api_key_file=$out/gpufleet.apikey ansible_python_interpreter=$repo/.venv/bin/python"
  head -n 100 "$out/$shape"/*.ray.env "$out/$shape"/*.ray.service "$out/$shape"/head.yaml
done
