"""The lab's network: one bridge and /24 per lab inside 10.231.0.0/16, a netns + veth per host, iptables.

Every iptables rule carries the comment ``gpufleet-lab:<name>`` so teardown finds all of them, even
after a crash that lost the state file.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from pathlib import Path

from gpufleet.lab.system import LabError, run, state_root

LAB_SUPERNET = ipaddress.ip_network("10.231.0.0/16")
# 10.231.0.0/24 is the shared reference script's; keep clear of it.
FIRST_INDEX = 1
LAST_INDEX = 254
HOST_OFFSET = 10  # node1 = .11, node2 = .12, ...
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def subnet(index: int) -> ipaddress.IPv4Network:
    """The /24 of the lab with this index."""
    return ipaddress.IPv4Network(f"10.231.{index}.0/24")


def bridge_name(index: int) -> str:
    return f"gflbr{index}"


def veth_name(index: int, node: int) -> str:
    return f"gfl{index}n{node}"


def host_ip(index: int, node: int) -> str:
    return str(subnet(index).network_address + HOST_OFFSET + node)


def bridge_ip(index: int) -> str:
    return str(subnet(index).network_address + 1)


def routed_subnets() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route on the machine, so a new lab never takes a subnet someone else uses."""
    routes = json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]")
    networks = []
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default":
            networks.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return networks


def free_index(taken: set[int]) -> int:
    """The lowest lab index whose /24 is neither in ``taken`` nor overlapping any route on the machine."""
    routed = routed_subnets()
    for index in range(FIRST_INDEX, LAST_INDEX + 1):
        if index not in taken and not any(subnet(index).overlaps(net) for net in routed):
            return index
    raise LabError(
        f"lab: subnet: found every /24 of {LAB_SUPERNET} in use; expected a free one. "
        "Fix: `gpufleet lab down --name NAME` labs you no longer need."
    )


def _tag(name: str) -> list[str]:
    return ["-m", "comment", "--comment", f"gpufleet-lab:{name}"]


def create_bridge(name: str, index: int, *, offline: bool) -> None:
    """Bridge + address + iptables rules for one lab; call delete_bridge first to clear a crashed run."""
    br = bridge_name(index)
    run(["ip", "link", "add", br, "type", "bridge"])
    run(["ip", "addr", "add", f"{bridge_ip(index)}/24", "dev", br])
    run(["ip", "link", "set", br, "up"])
    net = str(subnet(index))
    rules: list[list[str]] = []
    if offline:
        # Hosts have no default route; these drops also stop a host that adds one itself.
        rules += [
            ["INPUT", "-i", br, "!", "-d", bridge_ip(index), "-j", "DROP"],
            ["FORWARD", "-i", br, "!", "-o", br, "-j", "DROP"],
            ["FORWARD", "-o", br, "!", "-i", br, "-j", "DROP"],
        ]
    else:
        enable_forwarding()
        rules += [
            ["FORWARD", "-i", br, "!", "-o", br, "-j", "ACCEPT"],
            ["FORWARD", "-o", br, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
        ]
        masquerade = ["POSTROUTING", "1", "-s", net, "!", "-d", net, *_tag(name), "-j", "MASQUERADE"]
        _iptables(["-t", "nat", "-I", *masquerade])
    # With br_netfilter loaded, a dockerd on this machine (FORWARD policy DROP) would silently drop
    # host-to-host traffic on the bridge: accept it first.
    rules.append(["FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"])
    for chain, *spec in rules:
        jump = spec.index("-j")
        _iptables(["-I", chain, "1", *spec[:jump], *_tag(name), *spec[jump:]])


def delete_bridge(name: str, index: int | None) -> None:
    """Remove the lab's bridge (if any) and every iptables rule tagged with its name."""
    if index is not None:
        run(["ip", "link", "del", bridge_name(index)], check=False)
    for table, rule in tagged_rules(name):
        _iptables(["-t", table, "-D", *rule[1:]])
    if not any(table == "nat" for table, _ in tagged_rules(None)):
        restore_forwarding()


def tagged_rules(name: str | None) -> list[tuple[str, list[str]]]:
    """(table, `-A CHAIN ...` argv) of every rule of lab ``name`` (of any lab when None)."""
    found = []
    for table in ("filter", "nat"):
        for line in run(["iptables", "-w", "-t", table, "-S"]).stdout.splitlines():
            rule = shlex.split(line)
            if "--comment" not in rule:
                continue
            comment = rule[rule.index("--comment") + 1]
            if comment == f"gpufleet-lab:{name}" or (name is None and comment.startswith("gpufleet-lab:")):
                found.append((table, rule))
    return found


def outbound_drops(name: str) -> int:
    """Packets lab ``name``'s hosts sent beyond the lab, as its offline DROP rules counted them (iptables -v).

    Only an offline lab has these rules (else 0). Hosts have no default route, so a host that must not leave
    the lab fails at once; give it one to the bridge address (``ip route add default via <bridge_ip>``) to
    have such attempts reach the bridge, be dropped here and counted.
    """
    total = 0
    for line in run(["iptables", "-w", "-t", "filter", "-S", "-v"]).stdout.splitlines():
        rule = shlex.split(line)
        tagged = "--comment" in rule and rule[rule.index("--comment") + 1] == f"gpufleet-lab:{name}"
        from_hosts = "-i" in rule and rule[rule.index("-i") - 1] != "!"
        if tagged and from_hosts and rule[-2:] == ["-j", "DROP"] and "-c" in rule:
            total += int(rule[rule.index("-c") + 1])
    return total


def _iptables(args: list[str]) -> None:
    run(["iptables", "-w", *args])


def enable_forwarding() -> None:
    """Online labs route through this machine: IPv4 forwarding must be on (NAT does the rest).

    The value found is kept so the last online lab's teardown can put it back.
    """
    saved = state_root() / "ip_forward.orig"
    current = IP_FORWARD.read_text().strip()
    if current != "1":
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(current + "\n")
        IP_FORWARD.write_text("1\n")


def restore_forwarding() -> None:
    saved = state_root() / "ip_forward.orig"
    if saved.exists():
        IP_FORWARD.write_text(saved.read_text())
        saved.unlink()


def add_host_link(index: int, node: int, netns: str, *, offline: bool) -> None:
    """A fresh netns with eth0 on the lab bridge; a stale one from a crashed run is removed first."""
    delete_host_link(index, node, netns)
    veth = veth_name(index, node)
    run(["ip", "netns", "add", netns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    run(["ip", "link", "set", veth, "master", bridge_name(index), "up"])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])
    run(["ip", "-n", netns, "addr", "add", f"{host_ip(index, node)}/24", "dev", "eth0"])
    run(["ip", "-n", netns, "link", "set", "eth0", "up"])
    if not offline:
        run(["ip", "-n", netns, "route", "add", "default", "via", bridge_ip(index)])


def delete_host_link(index: int, node: int, netns: str) -> None:
    run(["ip", "link", "del", veth_name(index, node)], check=False)
    run(["ip", "netns", "del", netns], check=False)
