"""Placement: which GPUs of which nodes each replica of each service gets (design.md, "Serving topology").

A *service* is a model served under one name; it runs as *replicas*, each one vLLM engine of
``tensor_parallel_size x pipeline_parallel_size`` ranks. :func:`place` gives every replica concrete GPUs:

- a replica whose ranks fit in one node stays in one node (no Ray: vLLM's own multiprocessing executor);
  several replicas share a node when its GPUs allow;
- the replicas of one service spread over the eligible nodes first (a node lost takes one replica, not the
  service), then fill them;
- a replica spans nodes only when its shape needs it: whole pipeline stages (``tensor_parallel_size`` GPUs
  each) on as few nodes as hold them (Ray, as today's one instance); tensor parallelism never crosses a node,
  except for the inventory written before services (``spans_fleet``: one instance over every GPU, as before);
- ``replicas: auto`` (``None`` here) takes every eligible GPU the shape fits;
- a node without GPUs (the CPU build of vLLM, the lab) holds any number of one-rank replicas.

Everything that cannot be placed is said in one line each (:class:`gpufleet.problems.Problem`), naming the
smallest change that would fit. Memory is not placement's concern: each replica is planned afterwards against
its own GPUs (a 3090 replica and an H800 replica each get their own plan).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.problems import Problem

__all__ = ["Member", "Node", "Placement", "PlacementError", "Replica", "Shape", "place"]

# Replicas' ports, when a service sets none: the first free one from here, per node (the gateway, which
# clients reach, keeps the fleet's public port).
FIRST_REPLICA_PORT = 8100


@dataclass(frozen=True)
class Node:
    """A node as placement sees it: its name and GPU count (0: the CPU build of vLLM)."""

    name: str
    gpus: int


@dataclass(frozen=True)
class Shape:
    """What placement needs of a service."""

    service: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    replicas: int | None = 1  # None: auto, as many as fit
    hosts: tuple[str, ...] | None = None  # the nodes its replicas may use (None: every node)
    port: int | None = None  # its replicas' first port on a node (None: assigned from FIRST_REPLICA_PORT)
    spans_fleet: bool = False  # the inventory before services: one replica over every GPU of the fleet
    role: str | None = None  # prefill or decode: one of the two shapes of a P/D service (None: no roles)
    # the first NIXL side-channel port of its replicas on a node (None: no KV connector); each replica takes
    # tensor_parallel_size ports from the first free one
    side_channel_port: int | None = None

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class Member:
    """One node's part of a replica: the node and its GPU indices (empty on a node without GPUs)."""

    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Replica:
    service: str
    index: int  # 0, 1, ... within its service
    members: tuple[Member, ...]
    port: int
    # Its instance id (/etc/gpufleet/instances/<id>/, unit gpufleet-vllm@<id>): <service>-<index>, or
    # <service>-p<index> and <service>-d<index> for a P/D service's prefill and decode replicas; the one
    # replica of an inventory before services keeps the instance it always had (`default`): nothing moves.
    id: str
    role: str | None = None  # prefill, decode, or None (a service without roles)
    side_channel_port: int | None = None  # its first NIXL side-channel port on its node (P/D only)

    @property
    def node(self) -> str:
        """The node that runs its API server (the first member: rank 0, and the Ray head when it spans)."""
        return self.members[0].node

    @property
    def executor(self) -> str:
        """``mp`` inside one node, ``ray`` across nodes (vLLM's distributed_executor_backend)."""
        return "mp" if len(self.members) == 1 else "ray"


@dataclass(frozen=True)
class Placement:
    replicas: tuple[Replica, ...]

    def of(self, service: str) -> tuple[Replica, ...]:
        return tuple(replica for replica in self.replicas if replica.service == service)

    def on(self, node: str) -> tuple[Replica, ...]:
        """The replicas with a member on ``node``."""
        return tuple(r for r in self.replicas if any(m.node == node for m in r.members))


class PlacementError(Exception):
    """Services that cannot be placed; ``problems`` has one line for each."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


@dataclass
class _Free:
    """What is left of the nodes while placing: free GPU indices and taken ports, per node."""

    nodes: tuple[Node, ...]
    gpus: dict[str, list[int]] = field(default_factory=dict)
    ports: dict[str, set[int]] = field(default_factory=dict)
    side_ports: dict[str, set[int]] = field(default_factory=dict)  # NIXL side channels taken, per node
    count: dict[str, int] = field(default_factory=dict)  # replicas per node, every service

    def __post_init__(self) -> None:
        for node in self.nodes:
            self.gpus[node.name] = list(range(node.gpus))
            self.ports[node.name] = set()
            self.side_ports[node.name] = set()
            self.count[node.name] = 0

    def take(self, node: str, count: int) -> tuple[int, ...]:
        taken, self.gpus[node] = self.gpus[node][:count], self.gpus[node][count:]
        return tuple(taken)


def _where(shape: Shape) -> str:
    return f"service {shape.service}" + (f" ({shape.role})" if shape.role else "")


def place(nodes: Sequence[Node], shapes: Sequence[Shape]) -> Placement:
    """Every replica of every service on concrete GPUs, in the services' order; raises
    :class:`PlacementError` with every service that cannot be placed."""
    problems: list[Problem] = []
    seen: set[tuple[str, str | None]] = set()
    for shape in shapes:
        if (shape.service, shape.role) in seen:
            problems.append(
                Problem(
                    _where(shape),
                    "name",
                    f"{shape.service!r} twice",
                    "one name per service (clients send it as `model`)",
                    f"rename one of the two services named {shape.service}",
                )
            )
        seen.add((shape.service, shape.role))
    if problems:
        raise PlacementError(problems)
    free = _Free(tuple(nodes))
    replicas: list[Replica] = []
    for shape in shapes:
        try:
            replicas += _place_service(shape, free)
        except PlacementError as error:
            problems += error.problems
    if problems:
        raise PlacementError(problems)
    return Placement(tuple(replicas))


def _eligible(shape: Shape, free: _Free) -> list[Node]:
    if shape.hosts is None:
        return list(free.nodes)
    names = {node.name for node in free.nodes}
    unknown = [host for host in shape.hosts if host not in names]
    if unknown:
        raise PlacementError(
            [
                Problem(
                    _where(shape),
                    "hosts",
                    ", ".join(unknown),
                    "names of nodes in group gpu_nodes (" + ", ".join(sorted(names)) + ")",
                    "name nodes of the inventory, or leave hosts out to use every node",
                )
            ]
        )
    return [node for node in free.nodes if node.name in shape.hosts]


def _place_service(shape: Shape, free: _Free) -> list[Replica]:
    eligible = _eligible(shape, free)
    if shape.spans_fleet:
        return [_spanning(shape, eligible, free)]
    cpu = [node for node in eligible if node.gpus == 0]
    if cpu and len(cpu) == len(eligible):
        return _on_cpu_nodes(shape, cpu, free)
    gpu_nodes = [node for node in eligible if node.gpus > 0]
    largest = max((node.gpus for node in gpu_nodes), default=0)
    if shape.tensor_parallel_size > largest:
        stages = math.ceil(shape.world_size / max(largest, 1))
        raise PlacementError(
            [
                Problem(
                    _where(shape),
                    "tensor_parallel_size",
                    f"{shape.tensor_parallel_size} (its nodes have at most {largest} GPUs)",
                    f"at most {largest}: tensor parallelism stays inside a node",
                    f"set tensor_parallel_size to {largest} and pipeline_parallel_size to {stages} "
                    f"(pipeline stages may span nodes), or name nodes with {shape.tensor_parallel_size} GPUs",
                )
            ]
        )
    made: list[Replica] = []
    wanted = shape.replicas
    while wanted is None or len(made) < wanted:
        members = _one_replica(shape, gpu_nodes, free, made)
        if members is None:
            break
        made.append(_replica(shape, members, free, made))
    if not made or (wanted is not None and len(made) < wanted):
        raise PlacementError([_no_room(shape, len(made))])
    return made


def _one_replica(
    shape: Shape, nodes: list[Node], free: _Free, made: list[Replica]
) -> tuple[Member, ...] | None:
    """The members of the next replica, taken from ``free``; None when it does not fit."""
    world, tp = shape.world_size, shape.tensor_parallel_size
    mine = {node.name: sum(r.node == node.name for r in made) for node in nodes}
    order = {node.name: index for index, node in enumerate(nodes)}
    whole = [node for node in nodes if len(free.gpus[node.name]) >= world]
    if whole:  # inside one node: where this service has the fewest replicas, then the fewest GPUs left
        best = min(whole, key=lambda n: (mine[n.name], len(free.gpus[n.name]), order[n.name]))
        return (Member(best.name, free.take(best.name, world)),)
    # across nodes: whole stages of `tp` GPUs, on as few nodes as hold them
    stages_on = {node.name: len(free.gpus[node.name]) // tp for node in nodes}
    if sum(stages_on.values()) < shape.pipeline_parallel_size:
        return None
    members: list[Member] = []
    left = shape.pipeline_parallel_size
    for node in sorted(nodes, key=lambda n: (-stages_on[n.name], order[n.name])):
        stages = min(stages_on[node.name], left)
        if stages:
            members.append(Member(node.name, free.take(node.name, stages * tp)))
            left -= stages
        if not left:
            break
    return tuple(members)


def _replica(shape: Shape, members: tuple[Member, ...], free: _Free, made: Sequence[Replica]) -> Replica:
    node = members[0].node
    if shape.port is None:
        port = FIRST_REPLICA_PORT
        while port in free.ports[node]:
            port += 1
    else:  # its own replicas on one node count up from it
        port = shape.port + sum(r.node == node for r in made)
    if shape.port is not None and port in free.ports[node]:
        raise PlacementError(
            [
                Problem(
                    _where(shape),
                    "port",
                    f"{port}, taken on {node} by another replica",
                    "a port of its own on every node its replicas share",
                    f"set another port, or leave port out (each replica "
                    f"then gets the first free one from {FIRST_REPLICA_PORT})",
                )
            ]
        )
    free.ports[node].add(port)
    for member in members:
        free.count[member.node] += 1
    role = shape.role[0] if shape.role else ""  # p or d
    instance = shape.service if shape.spans_fleet else f"{shape.service}-{role}{len(made)}"
    side = _side_channel(shape, node, free)
    return Replica(shape.service, len(made), members, port, instance, shape.role, side)


def _side_channel(shape: Shape, node: str, free: _Free) -> int | None:
    """The first of ``tensor_parallel_size`` free NIXL side-channel ports on ``node`` from the shape's
    (one per rank: vLLM adds the rank's index to VLLM_NIXL_SIDE_CHANNEL_PORT), taken; None without one."""
    if shape.side_channel_port is None:
        return None
    width = max(shape.tensor_parallel_size, 1)
    first = shape.side_channel_port
    while any(first + offset in free.side_ports[node] for offset in range(width)):
        first += width
    free.side_ports[node].update(range(first, first + width))
    return first


def _spanning(shape: Shape, nodes: list[Node], free: _Free) -> Replica:
    """Today's one instance: every GPU of every node, head first (the inventory's order)."""
    members = tuple(Member(node.name, free.take(node.name, node.gpus)) for node in nodes if node.gpus)
    if not members:  # the CPU build on nodes without GPUs: the head serves
        members = (Member(nodes[0].name, ()),)
    return _replica(shape, members, free, ())


def _on_cpu_nodes(shape: Shape, nodes: list[Node], free: _Free) -> list[Replica]:
    if shape.world_size != 1:
        raise PlacementError(
            [
                Problem(
                    _where(shape),
                    "tensor_parallel_size x pipeline_parallel_size",
                    str(shape.world_size),
                    "1 on nodes without GPUs (the CPU build of vLLM runs one rank)",
                    "set both to 1",
                )
            ]
        )
    count = len(nodes) if shape.replicas is None else shape.replicas
    made: list[Replica] = []
    for _ in range(count):  # round robin over the nodes, the least loaded first
        node = min(nodes, key=lambda n: (sum(r.node == n.name for r in made), free.count[n.name]))
        made.append(_replica(shape, (Member(node.name, ()),), free, made))
    return made


def _no_room(shape: Shape, placed: int) -> Problem:
    world, fits = shape.world_size, placed
    if shape.replicas is None:
        return Problem(
            _where(shape),
            "replicas",
            f"auto, and no GPUs left for one replica of {world} GPUs",
            f"{world} free GPUs on one node, or whole pipeline stages of {shape.tensor_parallel_size} over "
            "several",
            "free GPUs (fewer replicas of the services before it), add nodes, or lower "
            "tensor_parallel_size x pipeline_parallel_size",
        )
    if not fits:
        return Problem(
            _where(shape),
            "replicas",
            f"{shape.replicas} of {world} GPUs each, and no GPUs left for one",
            f"{world} free GPUs on one node, or whole pipeline stages of {shape.tensor_parallel_size} over "
            "several",
            "free GPUs (fewer replicas of the services before it, or other hosts for it), or add nodes",
        )
    return Problem(
        _where(shape),
        "replicas",
        f"{shape.replicas} of {world} GPUs each",
        f"at most {fits} (the GPUs left on its nodes fit {fits})",
        f"set replicas to {fits}",
    )
