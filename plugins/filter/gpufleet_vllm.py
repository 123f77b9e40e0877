"""Ansible filter ``gpufleet_vllm_facts``: vLLM's start-up log -> its facts (:mod:`gpufleet.vllm_log`).

A thin adapter so that roles and the Python runner read the log the same way.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError


def gpufleet_vllm_facts(log: str, block_size: int | None = None) -> dict[str, Any]:
    """Facts of the last start-up in ``log`` (weights GiB, KV-cache tokens, concurrency, seconds to ready)."""
    try:
        from gpufleet.vllm_log import parse  # noqa: PLC0415  (the collection's Python is the gpufleet package)
    except ImportError as missing:
        raise AnsibleFilterError(
            f"gpufleet_vllm_facts: the gpufleet Python package is not importable ({missing}). "
            "Fix: pip install gpufleet on the control node (or in the execution environment)"
        ) from None
    return parse(log, block_size=block_size).model_dump()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpufleet_vllm_facts": gpufleet_vllm_facts}
