"""Every port a node listens on, from every role's variables: each in 1-65535 and each distinct on its host.

What one node runs: Ray (the head's GCS, dashboard and client server; every node's raylet, object manager,
agents, metrics port and its range of worker ports), vLLM (the head's API, the mp executor's master port),
the monitoring exporters (and Prometheus and Grafana on the head), and the artifact relays, which listen
during a re-deploy while the rest still serves. A value is the inventory's, else the role's default; a value
that is not a number is left to the value checks (:mod:`gpufleet.fleet.role_values`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.fleet.raw import RawHost, RawInventory
from gpufleet.fleet.role_values import ansible_bool, role_defaults
from gpufleet.problems import Problem

RAY_EVERY_NODE = (
    "ray_cluster_node_manager_port",
    "ray_cluster_object_manager_port",
    "ray_cluster_dashboard_agent_listen_port",
    "ray_cluster_dashboard_agent_grpc_port",
    "ray_cluster_runtime_env_agent_port",
    "ray_cluster_metrics_export_port",
)
RAY_HEAD = ("ray_cluster_port", "ray_cluster_dashboard_port", "ray_cluster_client_server_port")
# The relays listen one after the other (images, then the model): they may share a port with each other.
RELAYS = ("image_distribution_relay_port", "model_fetch_relay_port")
ROLES = ("ray_cluster", "vllm_service", "monitoring", "image_distribution", "model_fetch")


@dataclass(frozen=True)
class Listener:
    """``count`` ports from ``first``, set by ``variable`` (``count`` > 1: one per rank, or Ray's workers)."""

    variable: str
    first: int
    count: int = 1
    why: str = ""  # what the ports after the first are, for the message


def check_ports(raw: RawInventory, nodes: list[RawHost], root: Path | None) -> Iterator[Problem]:
    """Ports out of 1-65535 (derived ones included) and ports two services of one host both want."""
    defaults = {role: role_defaults(root, role) for role in ROLES}
    heads = raw.members("ray_head")
    head = heads[0].name if heads else None
    for host in nodes:
        found = listeners(host, host.name == head, defaults)
        yield from _out_of_range(host, found)
        yield from _collisions(host, found)


def listeners(host: RawHost, is_head: bool, defaults: Mapping[str, Mapping[str, Any]]) -> list[Listener]:
    """What ``host`` listens on."""

    def value(name: str) -> Any:
        role = next(role for role in ROLES if name.startswith(role + "_"))
        found = host.variables.get(name, defaults[role].get(name))
        return None if isinstance(found, str) and "{{" in found else found

    def port(name: str, count: int = 1, why: str = "") -> list[Listener]:
        first = _int(value(name))
        return [Listener(name, first, count, why)] if first is not None and count >= 1 else []

    found: list[Listener] = []
    if ansible_bool(value("ray_cluster_start_ray"), default=True):
        for name in RAY_EVERY_NODE + (RAY_HEAD if is_head else ()):
            found += port(name)
        low, high = _int(value("ray_cluster_min_worker_port")), _int(value("ray_cluster_max_worker_port"))
        if low is not None and high is not None:
            found.append(Listener("ray_cluster_min_worker_port", low, high - low + 1, "Ray's worker ports"))
    if is_head:
        found += port("vllm_service_port")
        if str(value("vllm_service_executor")) == "mp":
            found += port("vllm_service_master_port")
    if ansible_bool(host.variables.get("gpufleet_monitoring"), default=False):
        found += port("monitoring_node_exporter_port")
        if ansible_bool(host.variables.get("gpufleet_gpu"), default=True):
            found += port("monitoring_dcgm_exporter_port")
        if is_head:
            found += port("monitoring_prometheus_port")
            if ansible_bool(value("monitoring_grafana"), default=False):
                found += port("monitoring_grafana_port")
    for name in RELAYS:
        found += port(name)
    return found


def _out_of_range(host: RawHost, found: list[Listener]) -> Iterator[Problem]:
    for listener in found:
        last = listener.first + listener.count - 1
        if listener.count > 1 and listener.first <= last and (listener.first < 1 or last > 65535):
            yield Problem(
                f"host {host.name}",
                listener.variable,
                f"ports {listener.first}-{last} ({listener.why})",
                "ports from 1 to 65535, the ones derived from it included",
                f"set {listener.variable} at most {65536 - listener.count}",
            )
        elif listener.count < 1:
            yield Problem(
                f"host {host.name}",
                listener.variable,
                f"{listener.first}, above ray_cluster_max_worker_port ({last})",
                "ray_cluster_min_worker_port at most ray_cluster_max_worker_port",
                "swap the two values, or widen the range",
            )


def _collisions(host: RawHost, found: list[Listener]) -> Iterator[Problem]:
    used: dict[int, str] = {}
    for listener in found:
        for port in range(listener.first, listener.first + listener.count):
            other = used.get(port)
            relays = {other, listener.variable} <= set(RELAYS)
            if other is not None and other != listener.variable and not relays:
                span = f" (and the next {listener.count - 1}, {listener.why})" if listener.count > 1 else ""
                yield Problem(
                    f"host {host.name}",
                    listener.variable,
                    f"port {port}{span}, which {other} uses too",
                    "a port of its own on each host",
                    f"give {listener.variable} or {other} another port",
                )
                break
            used.setdefault(port, listener.variable)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
