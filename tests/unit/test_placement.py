"""Placement (planner/placement.py): every replica on concrete GPUs, or a line for each service that does
not fit."""

from __future__ import annotations

import pytest

from gpufleet.planner.placement import (
    FIRST_REPLICA_PORT,
    Member,
    Node,
    PlacementError,
    Shape,
    place,
)

PROD = (Node("gpu-head-01", 1), Node("gpu-worker-01", 1))  # inventories/prod: an RTX 3090 and an H800


def problems(nodes: tuple[Node, ...], *shapes: Shape) -> list[str]:
    with pytest.raises(PlacementError) as raised:
        place(nodes, shapes)
    return [str(problem) for problem in raised.value.problems]


def test_two_one_gpu_nodes_give_one_replica_each_inside_its_node() -> None:
    placement = place(PROD, [Shape("qwen", replicas=None)])
    assert [(r.id, r.members, r.executor, r.port) for r in placement.replicas] == [
        ("qwen-0", (Member("gpu-head-01", (0,)),), "mp", FIRST_REPLICA_PORT),
        ("qwen-1", (Member("gpu-worker-01", (0,)),), "mp", FIRST_REPLICA_PORT),
    ]


def test_the_inventory_before_services_is_one_replica_over_every_gpu() -> None:
    placement = place(PROD, [Shape("qwen", tensor_parallel_size=2, spans_fleet=True, port=8000)])
    (replica,) = placement.replicas
    assert replica.members == (Member("gpu-head-01", (0,)), Member("gpu-worker-01", (0,)))
    assert (replica.executor, replica.node, replica.port) == ("ray", "gpu-head-01", 8000)


def test_replicas_spread_over_nodes_before_they_share_one() -> None:
    nodes = (Node("a", 4), Node("b", 4))
    placement = place(nodes, [Shape("m", tensor_parallel_size=2, replicas=3)])
    assert [(r.node, r.members[0].gpus, r.port) for r in placement.replicas] == [
        ("a", (0, 1), FIRST_REPLICA_PORT),
        ("b", (0, 1), FIRST_REPLICA_PORT),
        ("a", (2, 3), FIRST_REPLICA_PORT + 1),  # a second replica on a: the next port
    ]


def test_auto_fills_the_eligible_gpus_and_the_next_service_takes_what_is_left() -> None:
    nodes = (Node("a", 8), Node("b", 2))
    placement = place(
        nodes, [Shape("big", tensor_parallel_size=4, replicas=None), Shape("small", replicas=2)]
    )
    assert [r.id for r in placement.of("big")] == ["big-0", "big-1"]  # a holds two of 4; b none
    assert {r.node for r in placement.of("big")} == {"a"}
    assert [(r.node, r.members[0].gpus) for r in placement.of("small")] == [("b", (0,)), ("b", (1,))]


def test_a_shape_larger_than_a_node_spans_nodes_by_whole_pipeline_stages() -> None:
    nodes = (Node("a", 2), Node("b", 4), Node("c", 2))
    (replica,) = place(nodes, [Shape("m", tensor_parallel_size=2, pipeline_parallel_size=3)]).replicas
    assert replica.members == (Member("b", (0, 1, 2, 3)), Member("a", (0, 1)))  # the fewest nodes
    assert replica.executor == "ray"


def test_hosts_limit_where_a_service_goes() -> None:
    nodes = (Node("a", 1), Node("b", 1), Node("c", 1))
    placement = place(nodes, [Shape("m", replicas=None, hosts=("c", "a"))])
    assert sorted(r.node for r in placement.replicas) == ["a", "c"]


def test_nodes_without_gpus_take_one_rank_replicas_round_robin() -> None:
    lab = (Node("node1", 0), Node("node2", 0), Node("node3", 0))
    placement = place(lab, [Shape("tiny", replicas=None), Shape("tiny2")])
    assert [(r.id, r.node, r.members[0].gpus) for r in placement.replicas] == [
        ("tiny-0", "node1", ()),
        ("tiny-1", "node2", ()),
        ("tiny-2", "node3", ()),
        ("tiny2-0", "node1", ()),
    ]
    assert placement.replicas[-1].port == FIRST_REPLICA_PORT + 1  # node1's second replica


def test_each_problem_is_one_line_naming_the_smallest_change() -> None:
    nodes = (Node("a", 2), Node("b", 1))
    said = problems(
        nodes,
        Shape("dup"),
        Shape("dup"),
    )
    assert said == [
        "service dup: name: found 'dup' twice; expected one name per service (clients send it as `model`). "
        "Fix: rename one of the two services named dup"
    ]
    assert problems(nodes, Shape("m", replicas=4)) == [
        "service m: replicas: found 4 of 1 GPUs each; expected at most 3 (the GPUs left on its nodes fit 3). "
        "Fix: set replicas to 3"
    ]
    assert problems(nodes, Shape("m", tensor_parallel_size=4)) == [
        "service m: tensor_parallel_size: found 4 (its nodes have at most 2 GPUs); expected at most 2: "
        "tensor parallelism stays inside a node. Fix: set tensor_parallel_size to 2 and "
        "pipeline_parallel_size to 2 (pipeline stages may span nodes), or name nodes with 4 GPUs"
    ]
    assert problems(nodes, Shape("m", hosts=("a", "z"))) == [
        "service m: hosts: found z; expected names of nodes in group gpu_nodes (a, b). Fix: name nodes of "
        "the inventory, or leave hosts out to use every node"
    ]
    # more GPUs claimed than exist: the first service takes them all, the second finds none
    assert problems(nodes, Shape("m", replicas=None), Shape("n", replicas=None)) == [
        "service n: replicas: found auto, and no GPUs left for one replica of 1 GPUs; expected 1 free GPUs "
        "on one node, or whole pipeline stages of 1 over several. Fix: free GPUs (fewer replicas of the "
        "services before it), add nodes, or lower tensor_parallel_size x pipeline_parallel_size"
    ]


def test_two_services_on_one_port_of_a_node_are_refused() -> None:
    nodes = (Node("a", 2),)
    said = problems(nodes, Shape("m", port=9000), Shape("n", port=9000))
    assert said == [
        "service n: port: found 9000, taken on a by another replica; expected a port of its own on every "
        "node its replicas share. Fix: set another port, or leave port out (each replica then gets the first "
        f"free one from {FIRST_REPLICA_PORT})"
    ]


def test_every_service_that_does_not_fit_is_named_not_only_the_first() -> None:
    nodes = (Node("a", 1),)
    said = problems(nodes, Shape("m", replicas=2), Shape("n", tensor_parallel_size=2))
    assert [line.split(":")[0] for line in said] == ["service m", "service n"]
