"""route_request: exact model, no half copies, cheapest wins, ties by pipeline_id."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import (
    ModelSpec,
    NoHealthyPipeline,
    NoSuchModel,
    RoutingError,
    RoutingRequest,
    Sample,
    SwarmState,
    route_request,
)
from tests.support.builders import measured, pipeline, plan

REQ = RoutingRequest()


def two_models() -> SwarmState:
    p = plan(
        [
            pipeline("base-r0", "base", ("a", 0, 4), ("b", 4, 8)),
            pipeline("base-r1", "base", ("c", 0, 8)),
            pipeline("vision-r0", "vision", ("v", 0, 4)),
        ]
    )
    return measured(p, {"a": (1, 0, 4), "b": (1, 0, 4), "c": (50, 0.9, 0.5), "v": (1, 0, 9)})


def test_the_cheapest_pipeline_of_the_model_wins() -> None:
    route = route_request("base", REQ, two_models())
    assert route.pipeline_id == "base-r0"
    assert route.node_ids == ("a", "b")


def test_another_model_is_never_served_even_when_cheaper() -> None:
    state = two_models().mark("a", alive=False).mark("c", alive=False)
    with pytest.raises(NoHealthyPipeline) as err:
        route_request("base", REQ, state)
    assert "down: a, c" in err.value.message


def test_a_pipeline_with_any_node_down_is_skipped() -> None:
    state = two_models().mark("b", alive=False)
    assert route_request("base", REQ, state).pipeline_id == "base-r1"


def test_an_unknown_model_is_a_typed_error_naming_what_is_served() -> None:
    with pytest.raises(NoSuchModel) as err:
        route_request("llama", REQ, two_models())
    assert err.value.code == "no_such_model"
    assert "base, vision" in err.value.message
    assert isinstance(err.value, RoutingError.NoSuchModel)


def test_a_known_model_without_pipelines_is_reported_as_such() -> None:
    p = plan([pipeline("base-r0", "base", ("a", 0, 4))])
    p = type(p)(
        epoch=1,
        models=(*p.models, ModelSpec(model_id="idle", layers=2, role="expert")),
        nodes=p.nodes,
        pipelines=p.pipelines,
    )
    with pytest.raises(NoSuchModel, match="has no pipeline"):
        route_request("idle", REQ, SwarmState.from_plan(p))


def test_ties_are_broken_by_pipeline_id() -> None:
    p = plan([pipeline("m-r1", "m", ("x", 0, 4)), pipeline("m-r0", "m", ("y", 0, 4))])
    assert route_request("m", REQ, measured(p)).pipeline_id == "m-r0"


def test_the_route_cost_includes_the_token_term() -> None:
    state = two_models()
    cheap = route_request("base", RoutingRequest(tokens=0), state)
    big = route_request("base", RoutingRequest(tokens=4096), state)
    assert big.cost - cheap.cost == pytest.approx(40.0)


def test_costs_are_computed_once_per_snapshot() -> None:
    state = two_models()
    assert state.cost_table("base") is state.cost_table("base")
    fresh = state.observe("a", Sample(load=1.0), now=1.0, alpha=1.0)
    assert fresh.cost_table("base") is not state.cost_table("base")
    assert route_request("base", REQ, fresh).pipeline_id == "base-r0"


def test_load_moves_traffic_to_the_other_copy() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 4)), pipeline("m-r1", "m", ("b", 0, 4))])
    state = measured(p, {"a": (5, 0.0, 1), "b": (6, 0.0, 1)})
    assert route_request("m", REQ, state).pipeline_id == "m-r0"
    hot = state.observe("a", Sample(load=1.0), now=1.0, alpha=1.0)
    assert route_request("m", REQ, hot).pipeline_id == "m-r1"


# -- properties ------------------------------------------------------------------------

nodes = [f"n{i}" for i in range(8)]


@st.composite
def swarms(draw: st.DrawFn) -> SwarmState:
    pipes = []
    for model in ("base", "expert"):
        for r in range(draw(st.integers(1, 4))):
            cut = draw(st.integers(1, 7))
            a, b = draw(st.sampled_from(nodes)), draw(st.sampled_from(nodes))
            pipes.append(pipeline(f"{model}-r{r}", model, (a, 0, cut), (b, cut, 8)))
    p = plan(pipes, capacity=1000)
    values = {
        n: (
            draw(st.sampled_from([1.0, 5.0, 10.0])),
            draw(st.sampled_from([0.0, 0.5])),
            draw(st.sampled_from([1.0, 2.0])),
        )
        for n in nodes
    }
    state = measured(p, values)
    for n in draw(st.sets(st.sampled_from(nodes), max_size=4)):
        if n in state.nodes:
            state = state.mark(n, alive=False)
    return state


@given(state=swarms(), model=st.sampled_from(["base", "expert"]))
def test_a_route_never_includes_a_down_node_or_another_model(state: SwarmState, model: str) -> None:
    try:
        route = route_request(model, REQ, state)
    except NoHealthyPipeline:
        assert all(not state.pipeline_alive(p) for p in state.plan.pipelines_of(model))
        return
    assert route.model_id == model
    chosen = next(p for p in state.plan.pipelines if p.pipeline_id == route.pipeline_id)
    assert chosen.model_id == model
    assert all(state.is_alive(n) for n in route.node_ids)
    best = min(
        (state.pipeline_cost(p), p.pipeline_id)
        for p in state.plan.pipelines_of(model)
        if state.pipeline_alive(p)
    )
    assert (route.cost, route.pipeline_id) == pytest.approx(best)


@given(state=swarms(), seed=st.randoms())
def test_the_choice_does_not_depend_on_the_order_of_pipelines_in_the_plan(
    state: SwarmState, seed: random.Random
) -> None:
    shuffled = list(state.plan.pipelines)
    seed.shuffle(shuffled)
    other = SwarmState(
        type(state.plan)(
            epoch=1, models=state.plan.models, nodes=state.plan.nodes, pipelines=tuple(shuffled)
        ),
        state.nodes,
    )
    try:
        expected = route_request("base", REQ, state)
    except RoutingError:
        with pytest.raises(RoutingError):
            route_request("base", REQ, other)
        return
    assert route_request("base", REQ, other) == expected
    assert route_request("base", REQ, state) == expected  # and again: same answer
