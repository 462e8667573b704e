"""failover_in_swarm: intact replica, then splice, then degradation, then Unrecoverable."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from hecate.core import (
    FailoverOptions,
    ModelSpec,
    Recovered,
    Replacement,
    Route,
    RoutingRequest,
    SwarmState,
    Unrecoverable,
    failover_in_swarm,
    route_request,
)
from hecate.core.plan import covers_exactly
from tests.support.builders import measured, pipeline, plan

REQ = RoutingRequest()


def lose(
    state: SwarmState, node: str, options: FailoverOptions | None = None, model: str = "m"
) -> Recovered | Unrecoverable:
    """The lifecycle's order: route first, then mark the node dead, then fail over."""
    route = route_request(model, REQ, state)
    return failover_in_swarm(
        route, node, state.mark(node, alive=False), options or FailoverOptions()
    )


def test_a_lost_node_off_the_route_leaves_it_unaffected() -> None:
    state = measured(
        plan([pipeline("m-r0", "m", ("a", 0, 4)), pipeline("m-r1", "m", ("b", 0, 4))], latency_ms=1)
    )
    result = lose(state, "b")
    assert isinstance(result, Recovered)
    assert (result.kind, result.route.pipeline_id) == ("unaffected", "m-r0")


def test_an_intact_replica_is_preferred_to_a_splice() -> None:
    p = plan(
        [
            pipeline("m-r0", "m", ("a", 0, 4), ("b", 4, 8)),
            pipeline("m-r1", "m", ("c", 0, 4), ("d", 4, 8)),
        ]
    )
    result = lose(measured(p), "b")
    assert isinstance(result, Recovered)
    assert (result.kind, result.degraded, result.replaced) == ("replica", False, ())
    assert result.route.node_ids == ("c", "d")


def test_a_splice_swaps_only_the_lost_layers_and_lists_them() -> None:
    p = plan(
        [
            pipeline("m-r0", "m", ("a", 0, 4), ("b", 4, 8)),
            pipeline("m-r1", "m", ("c", 0, 4), ("d", 4, 8)),
        ]
    )
    state = measured(p).mark("c", alive=False)  # the other copy is already broken
    result = lose(state, "b")
    assert isinstance(result, Recovered)
    assert (result.kind, result.degraded) == ("splice", False)
    assert result.replaced == (Replacement(layer_start=4, layer_end=8, old_node="b", new_node="d"),)
    assert result.route.node_ids == ("a", "d")
    assert result.route.pipeline_id == "m-r0~splice"


def test_a_splice_may_take_a_lost_range_from_several_nodes() -> None:
    p = plan(
        [
            pipeline("m-r0", "m", ("a", 0, 8)),
            pipeline("m-r1", "m", ("c", 0, 3), ("d", 3, 6), ("e", 6, 8)),
            pipeline("m-r2", "m", ("x", 0, 6), ("y", 6, 8)),
        ]
    )
    state = measured(p, {"a": (1.0, 0.0, 9.0)}).mark("e", alive=False).mark("x", alive=False)
    result = lose(state, "a")
    assert isinstance(result, Recovered)
    assert result.kind == "splice"
    assert [(r.layer_start, r.layer_end, r.old_node, r.new_node) for r in result.replaced] == [
        (0, 3, "a", "c"),
        (3, 6, "a", "d"),
        (6, 8, "a", "y"),
    ]
    assert result.route.node_ids == ("c", "d", "y")


def test_a_splice_prefers_the_holder_that_reaches_furthest() -> None:
    p = plan(
        [
            pipeline("m-r0", "m", ("a", 0, 4), ("b", 4, 8)),
            pipeline("m-r1", "m", ("c", 0, 6), ("d", 6, 8)),
            pipeline("m-r2", "m", ("e", 0, 2), ("f", 2, 8)),
        ]
    )
    state = measured(p, {"a": (1.0, 0.0, 9.0), "b": (1.0, 0.0, 9.0)})
    state = state.mark("d", alive=False).mark("e", alive=False)
    result = lose(state, "a")
    assert isinstance(result, Recovered)
    assert result.route.node_ids == ("c", "b")  # c covers all of [0, 4) in one hop


def test_without_a_replica_or_a_splice_and_no_degradation_it_is_unrecoverable() -> None:
    state = measured(plan([pipeline("m-r0", "m", ("a", 0, 4), ("b", 4, 8))]))
    result = lose(state, "b")
    assert isinstance(result, Unrecoverable)
    assert result.code == "unrecoverable"
    assert "'b'" in result.message
    assert "not allowed" in result.message
    assert (result.model_id, result.lost_node) == ("m", "b")


def test_asked_again_without_a_new_loss_it_names_the_node_the_route_lost() -> None:
    """A request held for a route asks again with no node of its own to name (the
    lifecycle passes ''); the answer still names the dead node, never node ''."""
    state = measured(plan([pipeline("m-r0", "m", ("a", 0, 4), ("b", 4, 8))]))
    route = route_request("m", REQ, state)
    result = failover_in_swarm(route, "", state.mark("b", alive=False), FailoverOptions())
    assert isinstance(result, Unrecoverable)
    assert "node 'b' was lost from m-r0" in result.message
    assert result.lost_node == "b"


def reserve_plan(role: str = "reserve") -> SwarmState:
    p = plan(
        [pipeline("m-r0", "m", ("a", 0, 8)), pipeline("mini-r0", "mini", ("r", 0, 2))],
        models=[ModelSpec(model_id="m", layers=8), ModelSpec(model_id="mini", layers=2, role=role)],  # type: ignore[arg-type]
    )
    return measured(p)


def test_degradation_goes_to_the_reserve_model_and_says_so() -> None:
    result = lose(reserve_plan(), "a", FailoverOptions(allow_degraded=True, reserve_model="mini"))
    assert isinstance(result, Recovered)
    assert (result.kind, result.degraded) == ("degraded", True)
    assert result.route.model_id == "mini"


def test_degradation_without_a_reserve_model_is_unrecoverable() -> None:
    result = lose(reserve_plan(), "a", FailoverOptions(allow_degraded=True))
    assert isinstance(result, Unrecoverable)
    assert "no reserve model" in result.message


def test_an_expert_never_stands_in_for_the_base_model() -> None:
    result = lose(
        reserve_plan(role="expert"), "a", FailoverOptions(allow_degraded=True, reserve_model="mini")
    )
    assert isinstance(result, Unrecoverable)
    assert "role 'expert'" in result.message


def test_a_reserve_on_the_lost_node_is_no_rescue() -> None:
    p = plan(
        [pipeline("m-r0", "m", ("a", 0, 8)), pipeline("mini-r0", "mini", ("a", 0, 2))],
        models=[
            ModelSpec(model_id="m", layers=8),
            ModelSpec(model_id="mini", layers=2, role="reserve"),
        ],
    )
    result = lose(measured(p), "a", FailoverOptions(allow_degraded=True, reserve_model="mini"))
    assert isinstance(result, Unrecoverable)
    # Says the reserve is down too, not to "run failover" (this is the failover).
    assert "reserve model 'mini' cannot stand in either" in result.message
    assert "node down (a)" in result.message
    assert "run failover" not in result.message


def test_a_degraded_request_losing_the_reserves_own_node_says_so() -> None:
    state = reserve_plan().mark("a", alive=False)  # already answering from the reserve
    degraded = Route(
        model_id="mini", pipeline_id="mini-r0", cost=0.0, stages=state.plan.pipelines[1].stages
    )
    result = failover_in_swarm(
        degraded, "r", state, FailoverOptions(allow_degraded=True, reserve_model="mini")
    )
    assert isinstance(result, Unrecoverable)
    assert (result.model_id, result.lost_node) == ("mini", "r")
    # Not "model 'mini' has role 'reserve' and cannot stand in for 'mini'": what happened
    # is that the fallback itself lost its node.
    assert "'mini' is the reserve model, already standing in" in result.message
    assert "no further fallback" in result.message
    assert "cannot stand in for" not in result.message


# -- properties ------------------------------------------------------------------------

NODES = [f"n{i}" for i in range(7)]


@st.composite
def cases(draw: st.DrawFn) -> tuple[SwarmState, str]:
    layers = 6
    pipes = []
    for r in range(draw(st.integers(1, 4))):
        cuts = sorted(draw(st.sets(st.integers(1, layers - 1), max_size=3)))
        bounds = [0, *cuts, layers]
        stages = [(draw(st.sampled_from(NODES)), a, b) for a, b in itertools.pairwise(bounds)]
        pipes.append(pipeline(f"m-r{r}", "m", *stages))
    state = measured(plan(pipes, capacity=100))
    for n in draw(st.sets(st.sampled_from(NODES), max_size=3)):
        if n in state.nodes:
            state = state.mark(n, alive=False)
    return state, draw(st.sampled_from(NODES))


@given(case=cases())
def test_a_recovered_route_covers_every_layer_once_with_live_nodes_only(
    case: tuple[SwarmState, str],
) -> None:
    state, lost = case
    try:
        route = route_request("m", REQ, state)
    except Exception:
        return
    if lost not in state.nodes:
        return
    after = state.mark(lost, alive=False)
    result = failover_in_swarm(route, lost, after)
    if isinstance(result, Unrecoverable):
        # Then no intact replica exists and some lost layer has no live holder.
        assert not any(after.pipeline_alive(p) for p in after.plan.pipelines)
        return
    assert result.route.model_id == "m"
    assert not result.degraded
    assert covers_exactly(result.route.stages, 6)
    assert all(after.is_alive(n) for n in result.route.node_ids)
    for r in result.replaced:
        assert any(
            s.node_id == r.new_node
            and s.layer_start <= r.layer_start
            and r.layer_end <= s.layer_end
            for p in after.plan.pipelines
            for s in p.stages
        ), "a splice only uses nodes that hold those layers in the plan"
