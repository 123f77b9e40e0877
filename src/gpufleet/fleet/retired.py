"""What gpufleet no longer reads, refused with what to write instead: prefill/decode as pools.

Before P/D services, an inventory asked for prefill/decode disaggregation with two groups, children of
``gpu_nodes`` (``vllm_prefill``, ``vllm_decode``), served by the role ``vllm_pd`` (its ``vllm_pd_*``
variables, a proxy on the Ray head). Both are gone: a P/D fleet is one service of ``gpufleet_services`` with
``pd`` (:class:`gpufleet.fleet.schema.PdSpec`). Without these checks the groups would be served as one
model and the variables, no longer any role's, ignored without a word.
"""

from __future__ import annotations

from gpufleet.fleet.raw import RawInventory
from gpufleet.problems import Problem

GROUPS = ("vllm_prefill", "vllm_decode")
PREFIX = "vllm_pd_"  # the removed role's namespace
README = 'README "Prefill/decode disaggregation"'
AS_SERVICE = f"prefill/decode as a service instead, gpufleet_services with pd ({README})"

# Each vllm_pd_* setting -> what the services form sets instead (None: nothing; remove it).
REPLACED: dict[str, str | None] = {
    "vllm_pd_connector": "the service's pd.connector (NixlConnector, the default)",
    "vllm_pd_test_only_no_kv_transfer": "the service's pd.kv_transfer: false (TEST ONLY)",
    "vllm_pd_tensor_parallel_size": (
        "the service's pd.prefill.serving.tensor_parallel_size and pd.decode.serving.tensor_parallel_size"
    ),
    "vllm_pd_port": "pd.prefill.serving.port / pd.decode.serving.port (unset: each replica's from 8100)",
    "vllm_pd_side_channel_port": "the service's pd.side_channel_port",
    "vllm_pd_nccl_port": None,  # P2pNcclConnector: vllm-router's P/D mode reaches NixlConnector only
    "vllm_pd_ucx_net_devices": "the service's pd.ucx_net_devices",
    "vllm_pd_config": (
        "the service's serving (block_size, kv_cache_dtype, dtype, max_model_len: both roles share them) "
        "or pd.prefill.serving / pd.decode.serving, in the schema's names (block_size, not block-size)"
    ),
    "vllm_pd_env": "vllm_service_env",
    "vllm_pd_proxy_host": "gateway_edge_host (the gateway's edge serves every service)",
    "vllm_pd_proxy_port": "gateway_edge_port (the gateway's edge serves every service)",
    "vllm_pd_api_key_file": "gpufleet_api_key_file",
    "vllm_pd_start_timeout": "vllm_service_start_timeout",
    "vllm_pd_start_restarts": "vllm_service_start_restarts",
    "vllm_pd_stop_timeout": "vllm_service_stop_timeout",
    "vllm_pd_log_lines": "vllm_service_log_lines",
}


def group_problems(raw: RawInventory) -> list[Problem]:
    """One problem for the old pool groups, when either has a host, with the service's ``pd`` written out."""
    members = {group: [host.name for host in raw.members(group)] for group in GROUPS}
    present = [group for group in GROUPS if members[group]]
    if not present:
        return []
    where = " and ".join(present)
    found = " and ".join(f"{', '.join(members[group])} in {group}" for group in present)
    roles = ", ".join(
        f"{role}: {{hosts: [{', '.join(members[group])}]}}"
        for role, group in zip(("prefill", "decode"), GROUPS, strict=True)
        if members[group]
    )
    groups = f"group{'s' if len(present) > 1 else ''} {where}"
    return [
        Problem(
            groups,
            "hosts",
            f"{found} (prefill/decode pools of the removed role vllm_pd)",
            AS_SERVICE,
            f"remove the {groups} (and their group_vars), and list the model in gpufleet_services with "
            f"pd: {{{roles}}} (inventories/examples/pd is one)",
        )
    ]


def variable_problem(host: str, name: str) -> Problem:
    """A ``vllm_pd_*`` setting on ``host``: what replaces it, or that nothing does."""
    replacement = REPLACED.get(name)
    fix = (
        f"set {replacement} instead, and remove {name}"
        if replacement
        else "remove it: the services form has no such setting"
        + (" (NixlConnector only)" if name == "vllm_pd_nccl_port" else "")
    )
    return Problem(
        f"host {host}",
        name,
        "a setting of the removed role vllm_pd (prefill/decode pools)",
        AS_SERVICE,
        fix,
    )
