"""Prefill/decode disaggregation: two vLLM pools with a KV connector and a proxy, checked before any host.

An inventory asks for it with two groups, children of ``gpu_nodes``: ``vllm_prefill`` and ``vllm_decode``.
Each of their hosts runs one vLLM instance (role ``vllm_pd``) with its pool's
``vllm_pd_tensor_parallel_size``; the proxy on the Ray head serves the one OpenAI-compatible endpoint and
sends every request to a prefill instance (``max_tokens`` 1, the KV cache kept for transfer) and then to a
decode instance, which pulls the KV cache over the connector (NixlConnector by default, over UCX;
P2pNcclConnector the alternative).

What cannot work is refused here, with the host, the variable and the fix: an empty pool, a host in both
pools, a decode pool whose KV-cache dtype or block size differs from the prefill pool's (the connector copies
blocks as they are), a connector the image lacks (:mod:`gpufleet.compat` knows whether an image has NIXL),
a pool whose tensor parallelism its hosts' GPUs cannot hold. Each pool is
planned on its own (the planner, with the pool's tensor parallel size on one host's GPUs).

The lab's CPU image has no connector at all; ``vllm_pd_test_only_no_kv_transfer: true`` lets tests run the
pools and the proxy without KV transfer (each decode instance then computes the prompt again), and says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpufleet.compat import ImageFacts, image_facts
from gpufleet.fleet.compatibility import _from_bundle
from gpufleet.fleet.raw import RawHost, RawInventory
from gpufleet.fleet.role_values import role_defaults
from gpufleet.fleet.schema import ServingSpec
from gpufleet.problems import Problem

if TYPE_CHECKING:
    from gpufleet.fleet.schema import FleetSpec
    from gpufleet.planner import PlanRequest

    # validate.plan_request: the planner's input for the fleet (passed in: validate imports this module)
    PlannerInput = Callable[[FleetSpec], tuple[PlanRequest | None, list[Problem]]]

PREFILL = "vllm_prefill"
DECODE = "vllm_decode"
POOLS = (PREFILL, DECODE)
CONNECTORS = ("NixlConnector", "P2pNcclConnector")
TEST_SWITCH = "vllm_pd_test_only_no_kv_transfer"

# Settings that must be equal in both pools: the connector copies KV-cache blocks as they are.
# name -> (vllm_pd_config key, the vllm_service_* variable it defaults to, that variable's default).
MUST_MATCH = {
    "vllm_pd_config block-size": ("block-size", "vllm_service_block_size", 16),
    "vllm_pd_config kv-cache-dtype": ("kv-cache-dtype", "vllm_service_kv_cache_dtype", "auto"),
}
PROXY_PORT = "vllm_pd_proxy_port"
# vllm_pd_config keys that are vllm_service_* settings: each pool's value is checked by the same schema field
CONFIG_FIELDS = {
    "block-size": "block_size",
    "kv-cache-dtype": "kv_cache_dtype",
    "dtype": "dtype",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "max-model-len": "max_model_len",
    "max-num-seqs": "max_num_seqs",
    "max-num-batched-tokens": "max_num_batched_tokens",
    "cpu-offload-gb": "cpu_offload_gb",
    "quantization": "quantization",
    "enforce-eager": "enforce_eager",
}
# Names vLLM gives one KV-cache dtype: fp8 is fp8_e4m3 (CacheConfig), so the pools agree.
SAME_KV_DTYPE = {"fp8": "fp8_e4m3"}


@dataclass
class Disaggregation:
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def has_pools(raw: RawInventory) -> bool:
    """Whether the inventory asks for prefill/decode pools (either group has a host)."""
    return any(raw.members(group) for group in POOLS)


def _value(host: RawHost, name: str, defaults: Mapping[str, Any]) -> Any:
    """A vllm_pd_* setting as the role sees it: the inventory's, else vllm_service's, else the default."""
    if name in MUST_MATCH:
        key, fallback, default = MUST_MATCH[name]
        config = host.variables.get("vllm_pd_config") or {}
        return (
            config[key]
            if isinstance(config, Mapping) and key in config
            else host.variables.get(fallback, default)
        )
    if name in host.variables:
        return host.variables[name]
    value = defaults.get(name)
    if isinstance(value, str) and "{{" in value:  # a templated default: its own fallback is not ours to judge
        return None
    return value


def check_disagg(
    raw: RawInventory,
    variables: Mapping[str, Any],
    root: Path | None,
    fleet: FleetSpec | None = None,
    *,
    image: ImageFacts | None = None,
    planner_input: PlannerInput | None = None,
) -> Disaggregation:
    """Every reason the inventory's prefill/decode pools cannot work; nothing for a one-pool inventory.

    ``variables`` are the head's (the image is the fleet's ``ray_cluster_image``, judged from the bundle's
    lock when the fleet has one, else from :mod:`gpufleet.compat`'s table); ``image`` overrides that.
    """
    result = Disaggregation()
    if not has_pools(raw):
        return result
    if image is None:
        reference = str(
            variables.get("ray_cluster_image") or role_defaults(root, "ray_cluster").get("ray_cluster_image")
        )
        image = image_facts(reference, _from_bundle(fleet, reference) if fleet is not None else None)
    defaults = role_defaults(root, "vllm_pd")
    pools = {group: raw.members(group) for group in POOLS}
    result.problems += _pool_membership(raw, pools)
    if not all(pools.values()):
        return result
    result.problems += _pool_settings(pools)
    result.problems += _mismatched(pools, defaults)
    kv_off = any(bool(_value(host, TEST_SWITCH, defaults)) for hosts in pools.values() for host in hosts)
    connector_problems, connector_warnings = _connector(pools, image, defaults, kv_off)
    result.problems += connector_problems
    result.warnings += connector_warnings
    result.problems += _parallelism(pools, defaults)
    if fleet is not None and planner_input is not None and not result.problems:
        _plan_pools(fleet, pools, defaults, result, planner_input)
    return result


def _pool_membership(raw: RawInventory, pools: Mapping[str, list[RawHost]]) -> Iterator[Problem]:
    for group, hosts in pools.items():
        if not hosts:
            other = DECODE if group == PREFILL else PREFILL
            yield Problem(
                f"group {group}",
                "hosts",
                f"no host (while {other} has {', '.join(h.name for h in pools[other])})",
                "at least one host in each of vllm_prefill and vllm_decode",
                f"add a host of gpu_nodes to {group}, or remove {other} to serve one pool",
            )
        for host in hosts:
            if "gpu_nodes" not in host.groups:
                yield Problem(
                    f"host {host.name}",
                    "groups",
                    f"in {group} but not in gpu_nodes",
                    "every pool host in gpu_nodes (ray_cluster makes its container)",
                    f"make {group} a child of gpu_nodes, or put {host.name} in gpu_nodes",
                )
    for host in raw.hosts:
        if set(POOLS) <= host.groups:
            yield Problem(
                f"host {host.name}",
                "groups",
                "in vllm_prefill and in vllm_decode",
                "one pool per host (each host runs one vLLM instance)",
                f"remove {host.name} from one of the two groups",
            )


def _pool_settings(pools: Mapping[str, list[RawHost]]) -> Iterator[Problem]:
    """Each pool's vllm_pd_config serving settings, by the single pool's rules (ServingSpec's fields)."""
    for group, hosts in pools.items():
        for host in hosts:
            config = host.variables.get("vllm_pd_config") or {}
            if not isinstance(config, Mapping):
                continue  # not a mapping: the role's argument spec (the value checks) says so
            for key in config:
                if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", key):
                    # vLLM reads block_size as block-size: written so, it escaped the checks here
                    yield Problem(
                        f"host {host.name} ({group})",
                        "vllm_pd_config",
                        f"the key {key!r}",
                        "vLLM's long option names as written after --, lowercase with '-' (block-size)",
                        f"write the key as {str(key).lower().replace('_', '-').strip('-')!r}, or remove it",
                    )
            for key, field_name in CONFIG_FIELDS.items():
                if key not in config:
                    continue
                try:
                    ServingSpec.model_validate({field_name: config[key]})
                except ValidationError as error:
                    reason = str(error.errors()[0]["msg"]).removeprefix("Value error, ")
                    yield Problem(
                        f"host {host.name} ({group})",
                        f"vllm_pd_config {key}",
                        repr(config[key]),
                        reason[0].lower() + reason[1:],
                        f"give {key} in {group}'s vllm_pd_config a value vLLM takes "
                        f"(as for vllm_service_{field_name})",
                    )


def _kv_setting(name: str, value: Any) -> str:
    """A MUST_MATCH value as the connector sees it: 16 and "16" alike, fp8 and fp8_e4m3 alike."""
    text = str(value).strip()
    return SAME_KV_DTYPE.get(text, text) if name.endswith("kv-cache-dtype") else text


def _mismatched(pools: Mapping[str, list[RawHost]], defaults: Mapping[str, Any]) -> Iterator[Problem]:
    reference = pools[PREFILL][0]
    for name in MUST_MATCH:
        expected = _value(reference, name, defaults)
        for group, hosts in pools.items():
            for host in hosts:
                found = _value(host, name, defaults)
                if _kv_setting(name, found) != _kv_setting(name, expected):
                    yield Problem(
                        f"host {host.name} ({group})",
                        name,
                        f"{found!r}, while the prefill pool ({reference.name}) has {expected!r}",
                        "one value in both pools (the connector copies KV-cache blocks as they are)",
                        f"set {MUST_MATCH[name][1]} once, in group_vars/gpu_nodes.yml, and remove "
                        f"{MUST_MATCH[name][0]} from vllm_pd_config",
                    )


def _connector(
    pools: Mapping[str, list[RawHost]], image: ImageFacts, defaults: Mapping[str, Any], kv_off: bool
) -> tuple[list[Problem], list[str]]:
    problems: list[Problem] = []
    warnings: list[str] = []
    hosts = [host for members in pools.values() for host in members]
    connectors = {str(_value(host, "vllm_pd_connector", defaults) or "NixlConnector") for host in hosts}
    for connector in sorted(connectors - set(CONNECTORS)):
        problems.append(
            Problem(
                "group gpu_nodes",
                "vllm_pd_connector",
                repr(connector),
                f"one of {', '.join(CONNECTORS)}",
                "set vllm_pd_connector to NixlConnector (default) or P2pNcclConnector",
            )
        )
    if len(connectors) > 1:
        problems.append(
            Problem(
                "group gpu_nodes",
                "vllm_pd_connector",
                ", ".join(sorted(connectors)),
                "one connector in both pools",
                "set vllm_pd_connector once, in group_vars/gpu_nodes.yml",
            )
        )
    if kv_off:
        warnings.append(
            f"{TEST_SWITCH} is true: KV transfer is OFF (test only). The proxy sends each request to a "
            "prefill and then a decode instance, but the decode instance computes the prompt again; "
            "not for production"
        )
        return problems, warnings
    chosen = next(iter(connectors)) if len(connectors) == 1 else "several"
    lab = image.reference.startswith("gpufleet/vllm-cpu:")
    if lab:
        problems.append(
            Problem(
                "group gpu_nodes",
                "ray_cluster_image",
                f"{image.reference} (vLLM's CPU build: no NIXL, no NCCL) with vllm_pd_connector {chosen}",
                "an image whose vLLM can move the KV cache between GPUs",
                f"serve a CUDA vLLM image with the connector's packages; in the lab only, set {TEST_SWITCH}: "
                "true (KV transfer off)",
            )
        )
    elif chosen == "NixlConnector" and image.has_nixl is False:
        problems.append(
            Problem(
                "group gpu_nodes",
                "ray_cluster_image",
                f"{image.reference}, which has no NIXL (the `nixl` Python package, with UCX)",
                "an image with NIXL for vllm_pd_connector NixlConnector",
                "serve an image built with NIXL (vLLM's Dockerfile: INSTALL_KV_CONNECTORS=true), or set "
                "vllm_pd_connector to P2pNcclConnector",
            )
        )
    elif chosen == "NixlConnector" and image.has_nixl is None:
        warnings.append(
            f"ray_cluster_image: whether {image.reference} has NIXL (the `nixl` package, with UCX) is not "
            "known; NixlConnector needs it. Check with `docker run --rm IMAGE python3 -c 'import nixl'`"
        )
    return problems, warnings


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _parallelism(pools: Mapping[str, list[RawHost]], defaults: Mapping[str, Any]) -> Iterator[Problem]:
    for group, hosts in pools.items():
        for host in hosts:
            tp = _int(_value(host, "vllm_pd_tensor_parallel_size", defaults), 1)
            gpu = bool(host.variables.get("gpufleet_gpu", True))
            count = _int(host.variables.get("gpufleet_gpu_count"), 0)
            if tp < 1 or (gpu and count and tp > count):
                yield Problem(
                    f"host {host.name} ({group})",
                    "vllm_pd_tensor_parallel_size",
                    f"{tp} on a host with {count} GPU(s)",
                    "at least 1 and at most the host's GPUs (one instance per host, on that host's GPUs)",
                    f"set vllm_pd_tensor_parallel_size for {group} to at most {count}, or add GPUs",
                )


def _plan_pools(
    fleet: FleetSpec,
    pools: Mapping[str, list[RawHost]],
    defaults: Mapping[str, Any],
    result: Disaggregation,
    planner_input: PlannerInput,
) -> None:
    """Plan one instance of each pool: the pool's TP on its first host's GPUs (the same model, its own KV)."""
    from gpufleet.planner import GpuDevice, PlannerInputError, plan  # noqa: PLC0415

    nodes = {node.name: node for node in fleet.nodes}
    if not any(node.gpu for node in fleet.nodes):
        return
    request, problems = planner_input(fleet)
    if request is None and any(problem.found == "not set" for problem in problems):
        result.warnings.append(
            "gpufleet_model_config is not set: the pools' memory was not planned "
            "(point it at a copy of the model's config.json)"
        )
        return
    result.problems += problems
    if request is None:
        return
    from gpufleet.fleet.schema import gpu_memory_gib  # noqa: PLC0415

    for group, hosts in pools.items():
        host = hosts[0]
        node = nodes.get(host.name)
        memory = gpu_memory_gib(node.gpus) if node is not None else None
        if node is None or memory is None:
            continue
        tp = _int(_value(host, "vllm_pd_tensor_parallel_size", defaults), 1)
        pool_request = request.model_copy(
            update={
                "gpus": tuple(
                    GpuDevice(name=f"{node.gpus.model or 'GPU'} on {host.name}", memory_gib=memory)
                    for _ in range(tp)
                ),
                "tensor_parallel_size": tp,
                "pipeline_parallel_size": 1,
                "block_size": _int(_value(host, "vllm_pd_block_size", defaults), request.block_size),
                "kv_cache_dtype": str(
                    _value(host, "vllm_pd_kv_cache_dtype", defaults) or request.kv_cache_dtype
                ),
            }
        )
        try:
            outcome = plan(pool_request)
        except PlannerInputError as unmodelled:
            result.warnings.append(f"pool {group}: the model's memory was not planned: {unmodelled}")
            continue
        for error in outcome.errors:
            result.problems.append(
                Problem(
                    f"group {group}",
                    "vllm_pd_tensor_parallel_size (planner)",
                    error,
                    "a configuration vLLM accepts on one instance of the pool",
                    f"raise vllm_pd_tensor_parallel_size for {group}, or lower vllm_service_max_model_len",
                )
            )
        result.warnings += [f"pool {group}: {warning}" for warning in outcome.warnings]
