"""The control host: where what runs once per fleet lives (today the run marker of
:mod:`gpufleet.runner.head_marker`; the gateway of several services later), apart from the Ray head.

An inventory names it with the group ``gpufleet_control`` (one host, any host of the inventory: the gateway
may run on a machine without GPUs). Without that group the control host is the Ray head, as before the
group existed, so no working inventory has to change. The Ray head stays what it is: the node where the
engine's Ray cluster starts, a property of the instance that spans nodes.
"""

from __future__ import annotations

from gpufleet.fleet.raw import RawInventory
from gpufleet.problems import Problem

CONTROL_GROUP = "gpufleet_control"


def control_host(raw: RawInventory) -> str | None:
    """The host of ``gpufleet_control``, else the Ray head; None when the inventory has neither."""
    for group in (CONTROL_GROUP, "ray_head"):
        hosts = raw.members(group)
        if hosts:
            return hosts[0].name
    return None


def control_problems(raw: RawInventory) -> list[Problem]:
    """``gpufleet_control`` holds at most one host (optional: without it the Ray head is the control host)."""
    hosts = raw.members(CONTROL_GROUP)
    if len(hosts) <= 1:
        return []
    names = ", ".join(host.name for host in hosts)
    return [
        Problem(
            f"group {CONTROL_GROUP}",
            "hosts",
            f"{len(hosts)} hosts ({names})",
            "one host (what runs once per fleet: the run marker), or no such group (the Ray head is used)",
            f"keep one host in {CONTROL_GROUP}",
        )
    ]
