#!/bin/bash
# The Ray executor's payload for the GPU machine, as four parts in .gpu16/ (one per device call): p0 p1 p2 are
# the vLLM payload of build_payload.sh (.gpu/, built first if missing), split again into three equal parts so
# that each call keeps a few MiB for the working tree; p3 is Ray (the cp312 manylinux wheel, pinned below),
# unpacked, pruned and packed with xz (~27 MB). vLLM 0.24.0 declares no Ray requirement; its Ray executors
# need Ray >= 2.43 (ray_executor.py's check). Every dependency of Ray is on the machine or in the vLLM
# payload (checked here), so p3 holds Ray alone. .gpu16/payload.sha256 has the sha256 of the vLLM payload
# and of p3 as the device sees them under /root/stash. About 3 minutes, most of it xz on 2 cores.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
ray_version=${RAY_VERSION:-2.60.0}
work=${WORK:-/root/ray16}
py312=${PY312:-python3.12}
[ -f "$repo/.gpu/p2" ] && [ -f "$repo/.gpu/payload.sha256" ] || "$repo/tests/gpu/build_payload.sh"
mkdir -p "$work" "$repo/.gpu16" && cd "$work"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_28 manylinux_2_17 manylinux2014; do plat+=(--platform "${p}_x86_64"); done
pip=("$repo/.venv/bin/pip" --isolated --cert /etc/ssl/certs/ca-certificates.crt)

rm -rf rwheel && "${pip[@]}" download --no-deps "${plat[@]}" -d rwheel "ray==$ray_version"
"${pip[@]}" install --dry-run --ignore-installed --report ray.json "${plat[@]}" --target /tmp/unused \
  "ray==$ray_version" >/dev/null
# Ray's dependencies must all be on the machine (machine-packages.txt) or in the vLLM payload.
cat "$repo"/.gpu/p0 "$repo"/.gpu/p1 "$repo"/.gpu/p2 | xz -dc | tar -t | sed -n 's#^\./\([^/]*\)\.dist-info/METADATA$#\1#p' \
  >vllm-payload-dists.txt
"$py312" - "$repo/tests/gpu/machine-packages.txt" vllm-payload-dists.txt ray.json <<'PY'
import json, re, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
machine = {norm(x) for x in open(sys.argv[1]).read().split() if not x.startswith("#")}
payload = {norm(x.rsplit("-", 1)[0]) for x in open(sys.argv[2]).read().split()}
install = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.load(open(sys.argv[3]))["install"]]
missing = [f"{n}=={v}" for n, v in install if norm(n) != "ray" and norm(n) not in machine | payload]
print("Ray's dependencies:", ", ".join(f"{n} ({'machine' if norm(n) in machine else 'vLLM payload'})"
                                      for n, _ in install if norm(n) != "ray"))
sys.exit(f"not on the machine nor in the vLLM payload: {missing}" if missing else 0)
PY
rm -rf site && mkdir site && unzip -q rwheel/ray-"$ray_version"-*.whl -d site
# Not needed to run a cluster and vLLM's executor: the Java jars, the libraries on top of Ray core (RLlib,
# Tune, Train, Serve, Data, LLM) and the dashboard's web client (the dashboard does not start without
# ray[default]'s extra packages, as in vLLM's images).
rm -rf site/bin site/ray/jars site/ray/rllib site/ray/tune site/ray/train site/ray/serve site/ray/data \
  site/ray/llm site/ray/dashboard/client/build
tar -C site -cf - . | xz -T2 -6 >"$repo/.gpu16/p3"
cat "$repo"/.gpu/p0 "$repo"/.gpu/p1 "$repo"/.gpu/p2 >payload.tar.xz
rm -f "$repo"/.gpu16/p[0-2] && split -n 3 -d -a 1 payload.tar.xz "$repo/.gpu16/p"
{
  cat "$repo/.gpu/payload.sha256"
  (cd "$repo/.gpu16" && sha256sum p3 | sed 's#p3#/root/stash/p3#')
} >"$repo/.gpu16/payload.sha256"
ls -l "$repo"/.gpu16/p[0-9] && cat "$repo/.gpu16/payload.sha256"
