"""Compare Ray's view of the cluster with the inventory; print JSON {"alive": [...], "missing": [...]}.

Runs inside the head's container (docker exec -i ... python3 -), with the expectation in argv[1] as JSON:
[{"host": NAME, "ip": IP, "gpus": N}]. Always exits 0 with JSON, so Ansible can retry on the content.
"""

import json
import logging
import sys

expected = json.loads(sys.argv[1])
address = sys.argv[2]
try:
    # Ray exists only in the serving image this runs in: the control node has neither Ray nor its stubs.
    import ray  # type: ignore[import-not-found]

    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    ray.shutdown()
except Exception as exc:  # any failure to reach Ray means: keep waiting, say why
    print(json.dumps({"alive": [], "missing": [dict(e, why=f"Ray unreachable: {exc}") for e in expected]}))
    sys.exit(0)
alive = [
    {
        "ip": n["NodeManagerAddress"],
        "cpus": n["Resources"].get("CPU", 0),
        "gpus": n["Resources"].get("GPU", 0),
    }
    for n in nodes
]
by_ip = {a["ip"]: a for a in alive}
# A node that registers under another address than its gpufleet_node_ip (Ray picked another NIC's address).
unknown = sorted(ip for ip in by_ip if ip not in {e["ip"] for e in expected})
missing = []
for e in expected:
    node = by_ip.get(e["ip"])
    if node is None:
        why = "not registered with Ray under its gpufleet_node_ip"
        if unknown:
            why += f"; Ray has node(s) at {', '.join(unknown)}, which the inventory does not name:"
            why += " a node registered with another address (check --node-ip-address, gpufleet_node_ip"
            why += " and the NIC carrying it)"
        missing.append(dict(e, why=why))
    elif node["gpus"] != e["gpus"]:
        why = f"Ray sees {node['gpus']:g} GPU(s), the inventory declares gpufleet_gpu_count={e['gpus']}"
        why += " (check the driver, the container toolkit and ray_cluster_num_gpus)"
        missing.append(dict(e, why=why))
    elif node["cpus"] <= 0:
        missing.append(dict(e, why="Ray sees no CPUs"))
print(json.dumps({"alive": alive, "missing": missing, "unknown": unknown}))
