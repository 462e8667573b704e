"""Planner strategies: who runs which layers, for every model, under both strategies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.core import (
    PLANNERS,
    ModelSpec,
    NodeProfile,
    SwarmPlan,
    UnknownPlanner,
    get_planner,
)
from hecate.core.plan import ModelRole, covers_exactly

PLANNER_NAMES = sorted(PLANNERS)
SLUG_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def nodes(**capacities: int) -> list[NodeProfile]:
    return [NodeProfile(node_id=n, capacity_layers=c) for n, c in capacities.items()]


def model(
    model_id: str = "m", layers: int = 12, replicas: int = 1, role: ModelRole = "base"
) -> ModelSpec:
    return ModelSpec(model_id=model_id, layers=layers, replicas=replicas, role=role)


def assert_sound(plan: SwarmPlan) -> None:
    """The plan validates, every pipeline is whole, and no node holds more than it can."""
    assert plan.validate() == []
    layers = {m.model_id: m.layers for m in plan.models}
    for p in plan.pipelines:
        assert covers_exactly(p.stages, layers[p.model_id]), p
    capacity = {n.node_id: n.capacity_layers for n in plan.nodes}
    for node_id, used in plan.layers_used().items():
        assert used <= capacity[node_id], (node_id, used)


def node_sets(plan: SwarmPlan, model_id: str) -> list[set[str]]:
    return [set(p.node_ids) for p in plan.pipelines_of(model_id)]


# -- registry ----------------------------------------------------------------------


def test_both_strategies_are_registered_and_built_by_name() -> None:
    assert set(PLANNERS) >= {"greedy", "proportional"}
    for name in ("greedy", "proportional"):
        assert get_planner(name).name == name


def test_an_unknown_planner_name_is_refused_with_the_known_names() -> None:
    with pytest.raises(UnknownPlanner) as excinfo:
        get_planner("nope")
    message = str(excinfo.value)
    assert "'nope'" in message
    for name in PLANNERS:
        assert name in message


# -- validity ----------------------------------------------------------------------

VALIDITY_CASES = [
    (nodes(solo=12), [model(layers=12)]),
    (nodes(a=6, b=6, c=6, d=6), [model(layers=12, replicas=2)]),
    (nodes(a=8, b=4, c=7, d=5, e=3), [model(layers=10, replicas=3)]),
    (nodes(a=1, b=1, c=1, d=1, e=1, f=1), [model(layers=3, replicas=2)]),
    (nodes(a=16, b=0, c=3), [model(layers=16, replicas=4)]),
    (
        nodes(a=12, b=12, c=10, d=4),
        [
            model("base", layers=12, replicas=2),
            model("res", layers=6, role="reserve"),
            model("exp", layers=8, replicas=2, role="expert"),
        ],
    ),
]


@pytest.mark.parametrize("name", PLANNER_NAMES)
@pytest.mark.parametrize(("profiles", "models"), VALIDITY_CASES)
def test_every_plan_validates_and_no_node_holds_more_than_its_capacity(
    name: str, profiles: list[NodeProfile], models: list[ModelSpec]
) -> None:
    plan = get_planner(name).plan(models, profiles)
    assert plan.pipelines, "every case has room for at least one pipeline"
    assert_sound(plan)


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_pipelines_are_named_after_their_model_and_replica_index(name: str) -> None:
    plan = get_planner(name).plan([model("ncm", layers=12, replicas=2)], nodes(a=6, b=6, c=6, d=6))
    assert [p.pipeline_id for p in plan.pipelines] == ["ncm-r0", "ncm-r1"]
    assert plan.epoch == 1


# -- determinism -------------------------------------------------------------------

DETERMINISM_NODES = [
    NodeProfile(node_id="n1", capacity_layers=7, latency_ms=3.0),
    NodeProfile(node_id="n2", capacity_layers=7, latency_ms=3.0),
    NodeProfile(node_id="n3", capacity_layers=5, latency_ms=1.0),
    NodeProfile(node_id="n4", capacity_layers=9, latency_ms=2.0),
    NodeProfile(node_id="n5", capacity_layers=4, latency_ms=0.0),
    NodeProfile(node_id="n6", capacity_layers=6, latency_ms=3.0),
]
DETERMINISM_MODELS = [
    model("base", layers=10, replicas=2),
    model("res", layers=5, role="reserve"),
    model("exp-a", layers=4, role="expert"),
    model("exp-b", layers=3, role="expert"),
]


@pytest.mark.parametrize("name", PLANNER_NAMES)
@settings(max_examples=50, deadline=None)
@given(
    node_order=st.permutations(DETERMINISM_NODES),
    model_order=st.permutations(DETERMINISM_MODELS),
)
def test_the_same_models_and_nodes_in_any_order_give_the_same_pipelines(
    name: str, node_order: list[NodeProfile], model_order: list[ModelSpec]
) -> None:
    reference = get_planner(name).plan(DETERMINISM_MODELS, DETERMINISM_NODES)
    plan = get_planner(name).plan(model_order, node_order)
    assert plan.pipelines == reference.pipelines
    assert plan.nodes == reference.nodes


@pytest.mark.parametrize("name", PLANNER_NAMES)
@settings(max_examples=50, deadline=None)
@given(
    node_order=st.permutations(DETERMINISM_NODES),
    model_order=st.permutations(DETERMINISM_MODELS),
)
def test_the_same_models_and_nodes_in_any_order_give_an_identical_plan(
    name: str, node_order: list[NodeProfile], model_order: list[ModelSpec]
) -> None:
    # The whole plan (what is shipped to other processes), not just its pipelines.
    reference = get_planner(name).plan(DETERMINISM_MODELS, DETERMINISM_NODES)
    plan = get_planner(name).plan(model_order, node_order)
    assert plan.pipelines == reference.pipelines
    assert plan.models == reference.models, "the plan's model list echoes the input order"
    assert plan == reference


# -- replicas ----------------------------------------------------------------------


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_replicas_of_one_model_share_no_node_on_four_equal_nodes(name: str) -> None:
    plan = get_planner(name).plan([model(layers=12, replicas=2)], nodes(a=6, b=6, c=6, d=6))
    first, second = node_sets(plan, "m")
    assert first.isdisjoint(second)
    assert first | second == {"a", "b", "c", "d"}


@pytest.mark.parametrize("name", PLANNER_NAMES)
@pytest.mark.parametrize(
    ("profiles", "layers"),
    [
        pytest.param(nodes(a=12, b=6, c=6), 12, id="one-big-two-small"),
        # {a, d} and {b, c} both hold 10 layers.
        pytest.param(nodes(a=8, b=6, c=4, d=2), 10, id="8-6-4-2"),
        # {a, b} and {c, d, e} both hold 6 layers.
        pytest.param(nodes(a=3, b=3, c=2, d=2, e=2), 6, id="3-3-2-2-2"),
    ],
)
def test_two_replicas_share_no_node_whenever_a_disjoint_split_exists(
    name: str, profiles: list[NodeProfile], layers: int
) -> None:
    plan = get_planner(name).plan([model(layers=layers, replicas=2)], profiles)
    sets = node_sets(plan, "m")
    assert len(sets) == 2, f"capacity allows two disjoint replicas, got {sets}"
    assert sets[0].isdisjoint(sets[1]), sets


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_a_model_gets_fewer_whole_replicas_when_capacity_is_short(name: str) -> None:
    # 20 layers of capacity: one copy of 12 fits, a second would be partial.
    plan = get_planner(name).plan([model(layers=12, replicas=3)], nodes(a=6, b=6, c=8))
    assert len(plan.pipelines_of("m")) == 1
    assert_sound(plan)


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_a_model_that_cannot_fit_once_gets_no_pipeline_rather_than_a_partial_one(
    name: str,
) -> None:
    plan = get_planner(name).plan([model(layers=12, replicas=2)], nodes(a=5, b=6, c=0))
    assert plan.pipelines == ()
    assert plan.validate() == []


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_a_model_asking_for_zero_replicas_gets_none(name: str) -> None:
    plan = get_planner(name).plan([model(layers=4, replicas=0)], nodes(a=8))
    assert plan.pipelines == ()


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_an_empty_swarm_gets_an_empty_but_valid_plan(name: str) -> None:
    plan = get_planner(name).plan([model(layers=4)], [])
    assert plan.pipelines == ()
    assert plan.validate() == []


# -- proportional shares -----------------------------------------------------------


def test_proportional_splits_layers_in_proportion_to_capacity() -> None:
    plan = get_planner("proportional").plan([model(layers=12)], nodes(a=8, b=4))
    (p,) = plan.pipelines
    assert [(s.node_id, s.size) for s in p.stages] == [("a", 8), ("b", 4)]


def test_proportional_halves_a_node_share_when_capacity_is_double_the_model() -> None:
    # 6 layers over 8 + 4: exactly 4 and 2; nobody is filled to the brim.
    plan = get_planner("proportional").plan([model(layers=6)], nodes(a=8, b=4))
    (p,) = plan.pipelines
    assert [(s.node_id, s.size) for s in p.stages] == [("a", 4), ("b", 2)]


def test_proportional_gives_the_leftover_layer_to_the_largest_remainder() -> None:
    # 10 layers over 7 + 5 + 3 = 15: quotas 4.67, 3.33, 2.00; floors 4, 3, 2 leave one
    # layer, which goes to the largest remainder (a: 10/15 > b: 5/15 > c: 0).
    plan = get_planner("proportional").plan([model(layers=10)], nodes(a=7, b=5, c=3))
    (p,) = plan.pipelines
    assert [(s.node_id, s.layer_start, s.layer_end) for s in p.stages] == [
        ("a", 0, 5),
        ("b", 5, 8),
        ("c", 8, 10),
    ]


def test_proportional_breaks_equal_remainders_by_node_id() -> None:
    # 10 layers over 4 + 4 + 4: quotas 3.33 each, one layer left, equal remainders.
    plan = get_planner("proportional").plan([model(layers=10)], nodes(c=4, b=4, a=4))
    (p,) = plan.pipelines
    assert [(s.node_id, s.size) for s in p.stages] == [("a", 4), ("b", 3), ("c", 3)]


def test_proportional_balances_replica_groups_by_total_capacity() -> None:
    # Roomiest first into the emptiest group: {8, 2} and {6, 4}, 10 layers each.
    plan = get_planner("proportional").plan(
        [model(layers=10, replicas=2)], nodes(a=8, b=6, c=4, d=2)
    )
    assert sorted(sorted(s) for s in node_sets(plan, "m")) == [["a", "d"], ["b", "c"]]
    assert plan.layers_used() == {"a": 8, "b": 6, "c": 4, "d": 2}


def test_greedy_fills_the_roomiest_node_first_and_finishes_with_the_smallest_that_fits() -> None:
    # b first (fewest hops); the last 2 layers go to a (4 free), the smallest node that
    # finishes the copy, keeping c's 6 layers whole for another copy or model.
    plan = get_planner("greedy").plan([model(layers=12)], nodes(a=4, b=10, c=6))
    (p,) = plan.pipelines
    assert [(s.node_id, s.size) for s in p.stages] == [("b", 10), ("a", 2)]


# -- model priority ----------------------------------------------------------------


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_models_are_planned_base_then_reserve_then_expert(name: str) -> None:
    # Ids sort the other way round on purpose: the role decides, not the name.
    models = [
        model("aa-expert", layers=4, role="expert"),
        model("bb-reserve", layers=4, role="reserve"),
        model("zz-base", layers=12),
    ]
    plan = get_planner(name).plan(models, nodes(a=12, b=4))
    assert [p.model_id for p in plan.pipelines] == ["zz-base", "bb-reserve"]
    assert plan.pipelines_of("aa-expert") == ()


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_an_expert_gets_capacity_only_after_every_base_replica(name: str) -> None:
    models = [model("exp", layers=12, role="expert"), model("base", layers=12, replicas=2)]
    plan = get_planner(name).plan(models, nodes(a=12, b=12))
    assert len(plan.pipelines_of("base")) == 2
    assert plan.pipelines_of("exp") == ()
    roomy = get_planner(name).plan(models, nodes(a=12, b=12, c=12))
    assert len(roomy.pipelines_of("base")) == 2
    assert len(roomy.pipelines_of("exp")) == 1


# -- property ----------------------------------------------------------------------

slugs = st.text(SLUG_ALPHABET, min_size=1, max_size=6)
profile_sets = st.dictionaries(slugs, st.integers(0, 16), max_size=8).map(
    lambda caps: [NodeProfile(node_id=n, capacity_layers=c) for n, c in caps.items()]
)


@pytest.mark.parametrize("name", PLANNER_NAMES)
@settings(max_examples=100, deadline=None)
@given(profiles=profile_sets, layers=st.integers(1, 24), replicas=st.integers(1, 4))
def test_every_pipeline_covers_all_layers_exactly_once_and_the_plan_validates(
    name: str, profiles: list[NodeProfile], layers: int, replicas: int
) -> None:
    plan = get_planner(name).plan([model(layers=layers, replicas=replicas)], profiles)
    assert_sound(plan)
    pipelines = plan.pipelines_of("m")
    assert len(pipelines) <= replicas
    total = sum(n.capacity_layers for n in profiles)
    assert len(pipelines) * layers <= total
    if total >= layers:
        assert pipelines, "one whole copy fits, so there must be one"
    for p in pipelines:
        assert len(set(p.node_ids)) == len(p.node_ids), "a node appears once per pipeline"


@settings(max_examples=100, deadline=None)
@given(profiles=profile_sets, layers=st.integers(1, 24), replicas=st.integers(1, 4))
def test_greedy_builds_as_many_replicas_as_total_capacity_holds(
    profiles: list[NodeProfile], layers: int, replicas: int
) -> None:
    plan = get_planner("greedy").plan([model(layers=layers, replicas=replicas)], profiles)
    total = sum(n.capacity_layers for n in profiles)
    assert len(plan.pipelines) == min(replicas, total // layers)
