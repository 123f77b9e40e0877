"""Ansible filter ``gpufleet_vllm_facts``: vLLM's start-up log -> its facts (:mod:`gpufleet.vllm_log`).

A thin adapter so that roles and the Python runner read the log the same way.
"""

from __future__ import annotations

from typing import Any

from gpufleet.vllm_log import parse


def gpufleet_vllm_facts(log: str, block_size: int | None = None) -> dict[str, Any]:
    """Facts of the last start-up in ``log`` (weights GiB, KV-cache tokens, concurrency, seconds to ready)."""
    return parse(log, block_size=block_size).model_dump()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpufleet_vllm_facts": gpufleet_vllm_facts}
