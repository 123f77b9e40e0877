"""Rules for the names of an inventory's hosts, which Ansible itself leaves open.

Ansible accepts a host named like a group (it warns "Found both group and host with same name" and then
its patterns, ``hosts:`` and ``--limit`` among them, take the group) and a name with control characters
or spaces (which gpufleet writes into systemd units, Ray's addresses and log lines). `gpufleet init`
refuses both before it writes an inventory; :func:`host_name_problems` is the check, on Ansible's reading.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.fleet.control import CONTROL_GROUP
from gpufleet.fleet.raw import RawInventory
from gpufleet.fleet.schema import HOST_NAME
from gpufleet.problems import Problem

# Groups every gpufleet inventory may have, with or without hosts: Ansible's own and gpufleet's.
FLEET_GROUPS = frozenset({"all", "ungrouped", "gpu_nodes", "ray_head", "ray_workers", CONTROL_GROUP})


def host_name_problems(raw: RawInventory, groups: Iterable[str] = ()) -> list[Problem]:
    """A problem for each host named like a group (``groups``, gpufleet's, or one its hosts are in) and for
    each name that is not a DNS-style host name (letters, digits, '-', '_', dots between labels)."""
    taken = FLEET_GROUPS | set(groups) | {group for host in raw.hosts for group in host.groups}
    problems = []
    for host in raw.hosts:
        if host.name in taken:
            problems.append(
                Problem(
                    f"host {host.name}",
                    "inventory_hostname",
                    f"{host.name!r}, which is also the name of a group",
                    "a host name that no group has",
                    "rename the host (Ansible's patterns, hosts: and --limit, take the group when a name "
                    "is both)",
                )
            )
        elif not HOST_NAME.fullmatch(host.name):
            problems.append(
                Problem(
                    f"host {host.name!r}",
                    "inventory_hostname",
                    repr(host.name),
                    "a host name: letters, digits, '-' and '_', labels of at most 63 between dots, no spaces "
                    "or control characters",
                    "rename the host, e.g. gpu-node-01",
                )
            )
    return problems
