"""Each node's share of a plan, and which shares a plan change rewrites
(hecate_planner.assignments): pure, over swarms that grow and shrink."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.core import ModelSpec, NodeProfile, Swarm, SwarmConfig, get_planner
from hecate.wire.messages import Held
from hecate_planner import assignments

MODEL = ModelSpec(model_id="m", layers=12, replicas=2, auto=True)


def _node(i: int) -> NodeProfile:
    return NodeProfile(node_id=f"n{i:03d}", capacity_layers=4 + i % 5)


def test_a_share_is_the_nodes_stages_and_a_spare_holds_none() -> None:
    plan = get_planner("greedy").plan([MODEL], [_node(i) for i in range(9)])
    shares = assignments.shares(plan)
    assert set(shares) == {n.node_id for n in plan.nodes}
    for p in plan.pipelines:
        for s in p.stages:
            assert (
                Held(model_id="m", layer_start=s.layer_start, layer_end=s.layer_end, executor="toy")
                in shares[s.node_id]
            )
    assert sum(len(h) for h in shares.values()) == sum(len(p.stages) for p in plan.pipelines)
    for spare in plan.spare_nodes():
        assert shares[spare] == ()


@settings(max_examples=60, deadline=None)
@given(
    first=st.integers(4, 30),
    moves=st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=12),
)
def test_writing_the_changes_keeps_every_key_equal_to_the_latest_plan(
    first: int, moves: list[tuple[bool, int] | None]
) -> None:
    """After each plan, the keys written so far plus the changes hold exactly each
    planned node's share, and an empty share for each node that left; a node whose
    share did not change is not rewritten."""
    swarm = Swarm([_node(i) for i in range(first)], SwarmConfig(12, "auto", model_id="m"))
    keys: dict[str, tuple[Held, ...]] = {}
    present = set(range(first))
    for move in [*moves, None]:
        before = dict(keys)
        changes = assignments.changes(keys, swarm.plan)
        keys.update(changes)
        now = assignments.shares(swarm.plan)
        for node_id, held in keys.items():
            assert held == now.get(node_id, ()), node_id
        for node_id in changes:
            assert before.get(node_id) != changes[node_id]
        assert assignments.changes(keys, swarm.plan) == {}
        if move is None:
            break
        join, i = move
        if join and i not in present:
            swarm.add_node(_node(i))
            present.add(i)
        elif not join and i in present and len(present) > 1:
            swarm.remove_node(_node(i).node_id)
            present.discard(i)


def test_a_notice_names_a_few_changes_and_none_past_the_most() -> None:
    few = {f"n{i}": () for i in range(3)}
    assert assignments.named(few) == ("n0", "n1", "n2")
    many = {f"n{i}": () for i in range(assignments.MOST_NAMED + 1)}
    assert assignments.named(many) is None
