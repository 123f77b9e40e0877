"""Lookup plugin ``gpufleet_placement``: the replicas of the inventory's services, as the planner places them.

``gpufleet plan`` prints the placement; the playbooks read the same one through this lookup (design.md,
"Serving topology"), so plain ``ansible-playbook`` and the CLI agree: ``playbooks/serve.yml`` runs each
replica placed on a node, ``playbooks/gateway.yml`` puts a router in front of each service's replicas.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_placement
author: gpufleet maintainers (@gpufleet)
short_description: The replicas of the inventory's services (gpufleet_services), placed on the nodes' GPUs
description:
  - Reads the run's inventory (C(ansible_inventory_sources)) with gpufleet's typed loader and places every
    replica of every service in C(gpufleet_services) (C(gpufleet.planner.placement)), as C(gpufleet plan)
    shows it.
  - C(replicas) (the default term) gives one entry per replica; C(gateway) gives one entry per service in the
    form the gateway role's C(gateway_services) takes, its workers the replicas' URLs on the cluster network;
    C(models) gives each model the services serve once (repo, revision, dir), in the services' order;
    C(metrics) gives what Prometheus scrapes of them (the monitoring role's C(monitoring_extra_targets)) -
    each replica's vLLM (job C(vllm)) and each service's router (job C(router), on C(gateway_host)), with
    labels C(node), C(service) (the service's name) and C(replica); and the edge's exporter (job C(edge), on
    C(gateway_host)) when C(edge_metrics_port) is set. C(stamps) gives the converged stamps the services
    leave on C(node) (model_fetch's per model directory, vllm_service's per replica placed there), for the
    whole deploy's fast path (playbooks/vars/fleet.yml).
  - An inventory without C(gpufleet_services) (one model, one instance) gives an empty list for both.
options:
  _terms:
    description: C(replicas), C(gateway), C(models), C(metrics) or C(stamps).
    type: list
    elements: str
    required: false
  first_port:
    description: The port of the first service's router on the gateway host; the next services take the next.
    type: int
    default: 8200
  first_metrics_port:
    description: The Prometheus port of the first service's router; the next services take the next.
    type: int
    default: 29200
  gateway_host:
    description: Where the routers' metrics listen (the gateway role's C(gateway_host)), for C(metrics).
    type: str
    default: 127.0.0.1
  node:
    description: The node whose converged stamps C(stamps) gives (the fleet check's and record's host).
    type: str
    default: ""
  edge_metrics_port:
    description: >-
      The port of the edge's Prometheus exporter on C(gateway_host) (the gateway role's
      C(gateway_edge_metrics_port)), for C(metrics); 0 when there is no edge.
    type: int
    default: 0
notes:
  - Runs on the control node. The gpufleet Python package must be importable by the Python that runs
    ansible-playbook.
"""

EXAMPLES = r"""
- name: Serve the replicas placed on this node
  ansible.builtin.include_role:
    name: vllm_service
  vars:
    vllm_service_instance_id: "{{ replica.id }}"
  loop: "{{ lookup('gpufleet_placement', 'replicas') | selectattr('node', 'eq', inventory_hostname) }}"
  loop_control:
    loop_var: replica
"""

RETURN = r"""
_raw:
  description: >-
    For C(replicas): id, service, name (what clients send as model), node, nodes, gpus, port, url,
    executor, model (repo, revision, dir), image (the service's, null for the fleet's), fleet_image
    (the ray_cluster role's default ray_cluster_image: the fleet's where the inventory sets none), serving
    (the vllm_service_* settings, less the prefix) and router_port (the port of its service's router on the
    gateway host).
    For C(gateway): name (the service's), model (what its clients send), port, metrics_port and workers.
    For C(metrics): job, target (host:port), labels. For C(stamps): the stamps' names (strings).
  type: list
  elements: raw
"""

import hashlib
import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

WHAT = ("replicas", "gateway", "models", "metrics", "stamps")


class LookupModule(LookupBase):  # type: ignore[misc]
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[Any]:
        self.set_options(var_options=variables, direct=kwargs)
        what = str(terms[0]) if terms else "replicas"
        if what not in WHAT:
            raise AnsibleError(f"gpufleet_placement: found {what!r}; expected one of {', '.join(WHAT)}")
        sources = (variables or {}).get("ansible_inventory_sources") or []
        replicas = [
            replica
            for source in ([sources] if isinstance(sources, str) else sources)
            for replica in self._placed(Path(str(source)))
        ]
        # each replica's router: its service's, on the port the gateway's list gives that service
        ports = {router["name"]: router["port"] for router in self._gateway(replicas)}
        for entry in replicas:
            entry["router_port"] = ports[entry["service"]]
        if what == "replicas":
            return replicas
        if what == "models":
            models = {json.dumps(replica["model"], sort_keys=True): replica["model"] for replica in replicas}
            return list(models.values())
        if what == "metrics":
            return self._metrics(replicas)
        if what == "stamps":
            return self._stamps(replicas)
        return self._gateway(replicas)

    @staticmethod
    def _placed(source: Path) -> list[dict[str, Any]]:
        """The replicas the planner places for the inventory ``source`` (none without services): kept, as
        gpufleet.fleet.placement_cache says, so that the next ask (another play, another worker) does not
        load and validate the inventory again."""
        try:
            from gpufleet.fleet.placement_cache import keep, kept_replicas, placement_key  # noqa: PLC0415
        except ImportError as exc:
            raise AnsibleError(
                "the gpufleet Python package is not importable by this ansible-playbook's Python; install it "
                "into the same environment (pip install -e . in the gpufleet checkout)"
            ) from exc
        key = placement_key(source)
        if key is not None and (kept := kept_replicas(key)) is not None:
            return kept
        from gpufleet.fleet.loaded import load  # noqa: PLC0415  (heavy: pydantic, the schema, the validator)
        from gpufleet.fleet.role_values import role_defaults  # noqa: PLC0415
        from gpufleet.fleet.services import place_fleet  # noqa: PLC0415
        from gpufleet.paths import project_root  # noqa: PLC0415
        from gpufleet.planner.placement import PlacementError  # noqa: PLC0415

        fleet = load(source)
        if fleet.spec is None:
            raise AnsibleError(
                f"gpufleet_placement: the inventory {source} is not valid:\n"
                + "\n".join(str(problem) for problem in fleet.problems)
            )
        replicas: list[dict[str, Any]] = []
        if fleet.spec.services:
            try:
                placement = place_fleet(fleet.spec)
            except PlacementError as error:
                raise AnsibleError(f"gpufleet_placement: {error}") from error
            services = {service.name: service for service in fleet.spec.services}
            # a services inventory runs no Ray container to take the fleet's image from (cluster.yml)
            fleet_image = role_defaults(project_root(), "ray_cluster").get("ray_cluster_image")
            addresses = {node.name: str(node.node_ip) for node in fleet.spec.nodes}
            for replica in placement.replicas:
                service = services[replica.service]
                serving = service.serving_of(replica.role)
                replicas.append(
                    {
                        "id": replica.id,
                        "service": replica.service,
                        "name": service.serving.served_model_name or service.name,
                        "node": replica.node,
                        "nodes": [member.node for member in replica.members],
                        "gpus": list(replica.members[0].gpus),
                        "port": replica.port,
                        "url": f"http://{addresses[replica.node]}:{replica.port}",
                        "executor": replica.executor,
                        "model": service.model.model_dump(mode="json", exclude={"config"}),
                        "image": service.image,
                        "fleet_image": fleet_image,
                        "serving": serving.model_dump(mode="json", exclude={"served_model_name", "port"}),
                        **_pd_fields(service, replica, addresses[replica.node]),
                    }
                )
        if key is not None:
            keep(key, replicas)
        return replicas

    def _metrics(self, replicas: list[dict[str, Any]]) -> list[Any]:
        """Each replica's vLLM on its URL's host:port, each router's metrics port and the edge's exporter
        (when its port is given), as scrape targets."""
        host = str(self.get_option("gateway_host"))
        vllm = [
            {
                "job": "vllm",
                "target": replica["url"].removeprefix("http://"),
                "labels": {
                    "node": replica["node"],
                    "service": replica["service"],
                    "replica": replica["id"],
                    **({"role": replica["role"]} if replica["role"] else {}),
                },
            }
            for replica in replicas
        ]
        routers = [
            {
                "job": "router",
                "target": f"{host}:{router['metrics_port']}",
                "labels": {"service": router["name"]},
            }
            for router in self._gateway(replicas)
        ]
        port = int(self.get_option("edge_metrics_port"))
        edge = [{"job": "edge", "target": f"{host}:{port}", "labels": {}}] if port and replicas else []
        return vllm + routers + edge

    def _stamps(self, replicas: list[dict[str, Any]]) -> list[Any]:
        """The converged stamps the services leave on ``node``, as the roles name them: model_fetch's, one per
        model directory (every node fetches every model: ``__model_fetch_stamp``), and vllm_service's, one per
        replica placed there (``__vllm_service_stamp``)."""
        node = str(self.get_option("node"))
        dirs = dict.fromkeys(str(replica["model"]["dir"]) for replica in replicas)
        fetched = [f"model_fetch@{hashlib.sha256(path.encode()).hexdigest()[:12]}" for path in dirs]
        return fetched + [f"vllm_service@{replica['id']}" for replica in replicas if replica["node"] == node]

    def _gateway(self, replicas: list[dict[str, Any]]) -> list[Any]:
        """A router per service (named as the service, its unit gpufleet-router@NAME), ``model`` the name its
        clients send, its workers the service's replicas."""
        first_port, first_metrics = (
            int(self.get_option("first_port")),
            int(self.get_option("first_metrics_port")),
        )
        services = list(dict.fromkeys(replica["service"] for replica in replicas))
        routers = []
        for index, service in enumerate(services):
            mine = [replica for replica in replicas if replica["service"] == service]
            router = {
                "name": service,
                "model": mine[0]["name"],
                "port": first_port + index,
                "metrics_port": first_metrics + index,
                "workers": [replica["url"] for replica in mine],
            }
            if mine[0]["role"]:  # a P/D service: its router in P/D mode, each replica by role
                router["pd"] = {
                    role: [replica["url"] for replica in mine if replica["role"] == role]
                    for role in ("prefill", "decode")
                }
            routers.append(router)
        return routers


def _pd_fields(service: Any, replica: Any, address: str) -> dict[str, Any]:
    """A replica's role and what its role needs of vLLM: the KV connector's --kv-transfer-config (prefill
    produces, decode consumes; None with kv_transfer false, the lab's TEST ONLY switch) and its environment
    (NIXL's side channel on its node's cluster address and its own ports; UCX's GET zero-copy over cuda_ipc,
    which UCX turns off without NVLink, so that the KV cache does not go GPU -> host -> TCP -> GPU:
    tests/gpu/README.md, "P/D through vllm-router")."""
    if service.pd is None:
        return {"role": None, "kv_transfer_config": None, "env": {}}
    pd = service.pd
    if not pd.kv_transfer:
        return {"role": replica.role, "kv_transfer_config": None, "env": {}}
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": address,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(replica.side_channel_port),
        "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y",
    }
    if pd.ucx_net_devices is not None:
        env["UCX_NET_DEVICES"] = pd.ucx_net_devices
    kv_role = "kv_producer" if replica.role == "prefill" else "kv_consumer"
    return {
        "role": replica.role,
        "kv_transfer_config": {"kv_connector": pd.connector, "kv_role": kv_role},
        "env": env,
    }
