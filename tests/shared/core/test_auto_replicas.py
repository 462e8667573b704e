"""``--pipelines auto``: every complete copy of the base the nodes can form, once every
model has its own; what cannot complete one is spare, and the plan names it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.core import PLANNERS, ModelSpec, NodeProfile, Swarm, SwarmConfig, get_planner
from hecate.core.planning import most_copies
from hecate.core.swarm import AUTO_FLOOR
from tests.shared.core.test_planners import assert_sound

PLANNER_NAMES = sorted(PLANNERS)


def fleet(count: int, capacity: int, prefix: str = "n") -> list[NodeProfile]:
    return [NodeProfile(node_id=f"{prefix}{i:03d}", capacity_layers=capacity) for i in range(count)]


def auto(layers: int, *others: ModelSpec) -> tuple[ModelSpec, ...]:
    base = ModelSpec(model_id="m", layers=layers, replicas=AUTO_FLOOR, auto=True)
    return (base, *others)


@pytest.mark.parametrize("planner", PLANNER_NAMES)
def test_forty_eight_nodes_of_eight_layers_make_eight_copies_of_forty_eight_and_no_spare(
    planner: str,
) -> None:
    plan = get_planner(planner).plan(auto(48), fleet(48, 8))
    assert_sound(plan)
    assert len(plan.pipelines) == 8
    assert plan.spare_nodes() == ()


def test_what_cannot_complete_a_copy_stays_spare_and_the_plan_names_it() -> None:
    plan = get_planner("greedy").plan(auto(48), fleet(50, 8))
    assert len(plan.pipelines) == 8
    assert len(plan.spare_nodes()) == 2


def test_the_other_models_have_their_copies_before_the_base_takes_the_rest() -> None:
    expert = ModelSpec(model_id="x", layers=16, replicas=1, role="expert")
    plan = get_planner("greedy").plan(auto(16, expert), fleet(8, 8))
    assert len(plan.pipelines_of("x")) == 1
    assert len(plan.pipelines_of("m")) == 3  # the floor of two, then one more
    assert plan.spare_nodes() == ()


def test_a_fixed_count_stays_that_count_whatever_the_capacity() -> None:
    fixed = ModelSpec(model_id="m", layers=48, replicas=2)
    plan = get_planner("greedy").plan((fixed,), fleet(48, 8))
    assert len(plan.pipelines) == 2
    assert len(plan.spare_nodes()) == 36


def test_a_config_of_auto_plans_the_floor_then_the_rest() -> None:
    swarm = Swarm(fleet(48, 8), SwarmConfig(48, "auto"))
    assert len(swarm.plan.pipelines) == 8
    base = swarm.plan.model("base")
    assert base is not None
    assert base.auto
    assert base.replicas == AUTO_FLOOR


def test_a_newcomer_that_completes_a_copy_with_the_spare_makes_one() -> None:
    swarm = Swarm(fleet(47, 8), SwarmConfig(48, "auto"))
    assert len(swarm.plan.pipelines) == 7
    assert len(swarm.plan.spare_nodes()) == 5
    growth = swarm.add_node(NodeProfile(node_id="late", capacity_layers=8))
    assert growth.kind == "replica"
    assert len(growth.pipelines) == 1
    assert len(swarm.plan.pipelines) == 8
    assert swarm.plan.spare_nodes() == ()


def test_a_newcomer_that_completes_nothing_joins_the_spare() -> None:
    swarm = Swarm(fleet(48, 8), SwarmConfig(48, "auto"))
    growth = swarm.add_node(NodeProfile(node_id="late", capacity_layers=8))
    assert growth.kind == "capacity"
    assert swarm.plan.spare_nodes() == ("late",)


@settings(max_examples=60, deadline=None)
@given(
    capacities=st.lists(st.integers(1, 16), min_size=1, max_size=40),
    layers=st.integers(1, 32),
    planner=st.sampled_from(PLANNER_NAMES),
)
def test_auto_leaves_no_complete_copy_on_the_table(
    capacities: list[int], layers: int, planner: str
) -> None:
    nodes = [NodeProfile(node_id=f"n{i:02d}", capacity_layers=c) for i, c in enumerate(capacities)]
    strategy = get_planner(planner)
    plan = strategy.plan(auto(layers), nodes)
    assert_sound(plan)
    used = plan.layers_used()
    free = {n.node_id: n.capacity_layers - used.get(n.node_id, 0) for n in nodes}
    assert len(plan.pipelines) <= sum(capacities) // layers
    # Another copy of the same strategy does not fit in what is left.
    model = plan.models[0]
    assert (
        strategy.copies(
            model,
            most_copies(model, free) + 1,
            dict(free),
            {n.node_id: n for n in nodes},
            first_index=99,
        )
        == []
    )
