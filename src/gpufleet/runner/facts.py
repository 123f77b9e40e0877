"""What the playbooks publish for the report, read once into one typed model: :class:`PublishedFacts`.

Contract with the playbooks (what the report reads). A task publishes a fact for the report by setting it
with ``ansible.builtin.set_fact`` (``cacheable`` or not) without ``no_log``; the report takes the last
value set by any host in the run:

- ``gpufleet_endpoint``: the OpenAI-compatible base URL, e.g. ``http://10.10.0.10:8000/v1`` (serve,
  status).
- ``gpufleet_vllm_facts``: a mapping with the fields of :class:`gpufleet.vllm_log.VllmFacts`, as the
  ``gpufleet_vllm_facts`` filter (plugins/filter/gpufleet_vllm.py) makes from vLLM's start-up log, plus
  ``served_model_name`` (serve, status). Other keys are ignored.
- ``gpufleet_vllm_ready``: true when /v1/models lists the served model (status).
- ``gpufleet_ray_nodes_alive``, ``gpufleet_ray_nodes_expected``, ``gpufleet_ray_gpus``: from ``ray
  status`` on the head and the inventory (status).
- ``gpufleet_ray_nodes_missing``: the inventory nodes Ray does not report alive, each a mapping with ``host``
  and ``why`` (status).
- ``gpufleet_nodes``: per serving node (a mapping by inventory name): ``container`` (Docker's state of the Ray
  container, ``missing`` or ``unreachable``), ``container_unit`` and ``vllm_unit`` (systemd's states), and
  ``procs``, what the vllm_service control script's ``procs`` printed: ``orphans`` (vLLM processes in the
  container outside the service) and ``gpu`` (``checked``, ``why``, ``outside``: GPU memory held by
  processes outside the service) (status).
- ``gpufleet_verify``: a mapping with the fields of :class:`gpufleet.runner.report.VerifyResult` (verify): the
  completion text, the status of the request without the key, whether /metrics answered, benchmark figures.
- ``gpufleet_service_load``: what vLLM does now (status): ``source: prometheus`` with ``results``, Prometheus'
  answer to each query of :data:`gpufleet.runner.service_load.PROMQL`; or ``source: metrics`` with ``first``
  and ``second``, the needed lines of two reads of /metrics ``seconds`` apart; or nothing.
- ``gpufleet_replicas``: services (serve): a mapping of each replica's instance id to its service, node, url,
  gpus and facts (its ``gpufleet_vllm_facts``); every node publishes its own replicas, the report takes all.
- ``gpufleet_replica_states``: services (status): every replica the planner placed, a list of mappings with
  the fields of :class:`gpufleet.runner.report.ReplicaState` (its unit's state on its node, ready or not).
- ``gpufleet_gateway_endpoint``: services (verify, status): where clients reach them, the gateway's edge
  (``http://HOST:PORT/v1``; empty without an edge).
- ``gpufleet_gateway_edge``: services (status): the edge as a client finds it, ``url``, ``status`` (of ``GET
  /v1/models`` with the key, 0 for no answer) and ``models`` (:class:`gpufleet.runner.report.EdgeState`).
- ``gpufleet_gateway``: the gateway's routers on the head (status), a list of mappings with the fields of
  :class:`gpufleet.runner.report.RouterState` (the gateway role's ``gateway_report``); empty without one.
- ``gpufleet_monitoring_endpoints``: ``prometheus`` and ``grafana`` URLs and ``targets_up`` (monitoring).
- ``gpufleet_rolling``: services (serve): where a rolling change stopped, the fields of
  :class:`gpufleet.runner.report.RollingStop` (the replica that failed, whether it was restored and why).
- ``gpufleet_rollback``: ``revision`` (the restored revision, the fields of
  :class:`gpufleet.runner.report.KeptRevision`), ``restarted`` and ``restored`` (per host, the lines of what
  it put back) (rollback).

A fact that does not have its contracted shape is left out (None, or empty), never an error: the report
says what it could read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from ansible.module_utils.parsing.convert_bool import boolean
from pydantic import BaseModel, ConfigDict, ValidationError

from gpufleet.runner.arguments import Facts
from gpufleet.runner.measured import RollingStop
from gpufleet.runner.report import (
    EdgeState,
    GpuHolder,
    KeptRevision,
    MissingNode,
    MonitoringEndpoints,
    NodeState,
    OrphanProcess,
    ReplicaReport,
    ReplicaState,
    RouterState,
    ServiceLoad,
    VerifyResult,
)
from gpufleet.runner.service_load import from_metrics, from_prometheus
from gpufleet.vllm_log import VllmFacts

_Entry = TypeVar("_Entry", bound=BaseModel)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def as_bool(value: object) -> bool:
    """Ansible's own reading of a boolean (``y``, ``yes``, ``on``, ``1``, ``true``, ``t``; else false).

    It is true for every value the playbooks' ``| bool`` takes as true (ansible-core 2.19's filter knows only
    ``yes``, ``on``, ``true``, ``1``), so a stage it turns on may find itself off, never the other way."""
    return bool(boolean(value, strict=False))


class RolledBack(_Frozen):
    """What playbooks/rollback.yml published as ``gpufleet_rollback``."""

    revision: KeptRevision | None = None
    restarted: bool = False
    restored: dict[str, tuple[str, ...]] = {}


class PublishedFacts(_Frozen):
    """Every fact of the contract above, typed; :meth:`read` makes it from a run's published facts."""

    endpoint: str | None = None
    served_model: str | None = None
    vllm: VllmFacts | None = None
    vllm_ready: bool = False
    ray_nodes_alive: float | None = None
    ray_nodes_expected: float | None = None
    ray_gpus: float | None = None
    ray_nodes_missing: tuple[MissingNode, ...] = ()
    nodes: tuple[NodeState, ...] = ()
    verify: VerifyResult | None = None
    service_load: ServiceLoad | None = None
    monitoring: MonitoringEndpoints | None = None
    rollback: RolledBack | None = None
    gateway: tuple[RouterState, ...] = ()
    gateway_endpoint: str | None = None
    replicas: tuple[ReplicaReport, ...] = ()
    replica_states: tuple[ReplicaState, ...] = ()
    gateway_edge: EdgeState | None = None
    rolling: RollingStop | None = None

    @classmethod
    def read(cls, facts: Facts) -> PublishedFacts:
        """The typed facts of a run (name -> (host, value), as the stage recorders keep them)."""
        values = {name: value for name, (_host, value) in facts.items()}
        vllm = _mapping(values, "gpufleet_vllm_facts")
        name = (vllm or {}).get("served_model_name")
        endpoint = values.get("gpufleet_endpoint")
        return cls(
            endpoint=None if endpoint is None else str(endpoint),
            served_model=None if name is None else str(name),
            vllm=_vllm_facts(vllm),
            vllm_ready=as_bool(values.get("gpufleet_vllm_ready", False)),
            ray_nodes_alive=_number(values, "gpufleet_ray_nodes_alive"),
            ray_nodes_expected=_number(values, "gpufleet_ray_nodes_expected"),
            ray_gpus=_number(values, "gpufleet_ray_gpus"),
            ray_nodes_missing=_missing_nodes(values.get("gpufleet_ray_nodes_missing")),
            nodes=_node_states(_mapping(values, "gpufleet_nodes") or {}),
            verify=_verify(_mapping(values, "gpufleet_verify")),
            service_load=_service_load(_mapping(values, "gpufleet_service_load") or {}),
            monitoring=_monitoring(_mapping(values, "gpufleet_monitoring_endpoints") or {}),
            rollback=_rolled_back(_mapping(values, "gpufleet_rollback")),
            gateway=_routers(values.get("gpufleet_gateway")),
            gateway_endpoint=str(values.get("gpufleet_gateway_endpoint") or "") or None,
            replicas=_replicas(_mapping(values, "gpufleet_replicas") or {}),
            replica_states=_listed(ReplicaState, values.get("gpufleet_replica_states")),
            gateway_edge=_edge(_mapping(values, "gpufleet_gateway_edge")),
            rolling=_rolling(_mapping(values, "gpufleet_rolling")),
        )


def _edge(published: Mapping[str, Any] | None) -> EdgeState | None:
    """The edge as the status playbook found it; None without one (one model, or no endpoint)."""
    if not published or not published.get("url"):
        return None
    try:
        return EdgeState.model_validate(published)
    except ValidationError:
        return None


def _replicas(published: Mapping[str, Any]) -> tuple[ReplicaReport, ...]:
    """Every replica the serve stage published (by instance id), in the order of their ids."""
    replicas = []
    for replica_id, value in sorted(published.items()):
        if isinstance(value, Mapping):
            facts = value.get("facts")
            vllm = _vllm_facts(facts) if isinstance(facts, Mapping) and facts else None
            replicas.append(
                ReplicaReport.model_validate(
                    {**value, "id": replica_id, "vllm": vllm, "gpus": value.get("gpus") or ()}
                )
            )
    return tuple(replicas)


def _mapping(values: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    value = values.get(name)
    return value if isinstance(value, Mapping) else None


def _number(values: Mapping[str, Any], name: str) -> float | None:
    try:
        return float(values[name])
    except (KeyError, TypeError, ValueError):
        return None


def _vllm_facts(published: Mapping[str, Any] | None) -> VllmFacts | None:
    if published is None:
        return None
    try:
        return VllmFacts.model_validate({k: v for k, v in published.items() if k in VllmFacts.model_fields})
    except ValidationError:
        return None


def _verify(published: Mapping[str, Any] | None) -> VerifyResult | None:
    if published is None:
        return None
    try:
        return VerifyResult.model_validate(
            {k: v for k, v in published.items() if k in VerifyResult.model_fields and v is not None}
        )
    except ValidationError:
        return None


def _monitoring(published: Mapping[str, Any]) -> MonitoringEndpoints | None:
    try:
        return MonitoringEndpoints.model_validate(
            {key: value for key, value in published.items() if value not in ("", None)}
        )
    except ValidationError:
        return None


def _missing_nodes(value: object) -> tuple[MissingNode, ...]:
    entries = value if isinstance(value, list) else []
    return tuple(
        MissingNode(host=str(e.get("host")), why=str(e.get("why") or "not reported by Ray"))
        for e in entries
        if isinstance(e, Mapping) and e.get("host")
    )


def _routers(value: object) -> tuple[RouterState, ...]:
    return _listed(RouterState, value)


def _listed(model: type[_Entry], value: object) -> tuple[_Entry, ...]:
    """A published list's entries as ``model``; an entry not as contracted is left out, as every fact is."""
    entries = value if isinstance(value, list) else []
    listed = []
    for entry in entries:
        try:
            listed.append(model.model_validate(entry))
        except ValidationError:
            continue
    return tuple(listed)


def _service_load(published: Mapping[str, Any]) -> ServiceLoad | None:
    if published.get("source") == "prometheus" and isinstance(published.get("results"), Mapping):
        return from_prometheus(published["results"])
    if published.get("source") == "metrics":
        first, second = published.get("first"), published.get("second")
        if isinstance(first, list) and isinstance(second, list) and second:
            try:
                seconds = float(published.get("seconds") or 5)
            except (TypeError, ValueError):
                return None
            return from_metrics(map(str, first), map(str, second), seconds)
    return None


def _node_states(nodes: Mapping[str, Any]) -> tuple[NodeState, ...]:
    return tuple(_node_state(str(host), published) for host, published in sorted(nodes.items()))


def _node_state(host: str, published: object) -> NodeState:
    state: Mapping[str, Any] = published if isinstance(published, Mapping) else {}
    procs: Mapping[str, Any] = state["procs"] if isinstance(state.get("procs"), Mapping) else {}
    gpu: Mapping[str, Any] = procs["gpu"] if isinstance(procs.get("gpu"), Mapping) else {}
    try:
        return NodeState(
            host=host,
            container=str(state.get("container") or "unknown"),
            container_unit=str(state.get("container_unit") or "unknown"),
            vllm_unit=str(state.get("vllm_unit") or "unknown"),
            orphans=tuple(OrphanProcess.model_validate(o) for o in procs.get("orphans") or ()),
            gpu_checked=bool(gpu.get("checked", False)),
            gpu_note=str(gpu.get("why") or ""),
            gpu_outside=tuple(GpuHolder.model_validate(g) for g in gpu.get("outside") or ()),
            procs_error=str(procs["error"]) if procs.get("error") else None,
            image_id=str(state.get("image_id") or "") or None,
            model_revision=str(state.get("model_revision") or "") or None,
            config_sha256=str(state.get("config_sha256") or "") or None,
        )
    except ValidationError as error:
        return NodeState(host=host, procs_error=f"unreadable report: {error}"[:300])


def _rolling(published: Mapping[str, Any] | None) -> RollingStop | None:
    if published is None:
        return None
    try:
        return RollingStop.model_validate({**published, "restored": as_bool(published.get("restored"))})
    except ValidationError:
        return None


def _rolled_back(published: Mapping[str, Any] | None) -> RolledBack | None:
    if published is None:
        return None
    try:
        revision: KeptRevision | None = KeptRevision.model_validate(published.get("revision") or {})
    except ValidationError:
        revision = None
    restored = published.get("restored")
    return RolledBack(
        revision=revision,
        restarted=as_bool(published.get("restarted")),
        restored={
            str(host): tuple(str(line) for line in lines or ())
            for host, lines in (restored.items() if isinstance(restored, Mapping) else ())
        },
    )
