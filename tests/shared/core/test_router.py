"""A router counts its own in-flight work, so a burst spreads before telemetry moves."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import (
    ColdPenalty,
    NoSuchModel,
    Route,
    Router,
    RoutingRequest,
    Sample,
    route_request,
)
from hecate.core.cost import inflight_cost
from tests.support.builders import measured, pipeline, plan

REQ = RoutingRequest()


def replicas(n: int) -> Router:
    p = plan([pipeline(f"m-r{i}", "m", (f"a{i}", 0, 4), (f"b{i}", 4, 8)) for i in range(n)])
    return Router(measured(p))


def test_with_nothing_in_flight_or_measured_the_router_agrees_with_route_request() -> None:
    router = replicas(3)
    ours, snapshot = router.route("m", REQ), route_request("m", REQ, router.state)
    assert ours.pipeline_id == snapshot.pipeline_id
    # Every pipeline unmeasured: each pays the same allowance, which changes no choice.
    assert ours.cost == pytest.approx(snapshot.cost + ColdPenalty().link_ms)


def test_a_burst_spreads_over_identical_replicas_before_any_reply() -> None:
    router = replicas(4)
    picks = []
    for _ in range(8):
        route = router.route("m", REQ)
        router.begin(route)
        picks.append(route.pipeline_id)
    assert Counter(picks) == {f"m-r{i}": 2 for i in range(4)}


def test_finishing_work_makes_the_copy_cheap_again() -> None:
    router = replicas(2)
    first = router.route("m", REQ)
    router.begin(first)
    assert router.route("m", REQ).pipeline_id != first.pipeline_id
    router.end(first)
    assert router.route("m", REQ).pipeline_id == first.pipeline_id
    assert router.in_flight() == 0


def test_in_flight_raises_the_cost_by_the_load_term() -> None:
    router = replicas(1)
    idle = router.route("m", REQ)
    router.begin(idle)
    busy = router.route("m", REQ)
    assert busy.cost - idle.cost == pytest.approx(2 * inflight_cost(1))  # two stages


def test_counts_survive_a_new_snapshot_and_a_new_plan() -> None:
    router = replicas(2)
    route = router.route("m", REQ)
    router.begin(route)
    router.update(router.state.observe("a0", Sample(latency_ms=9.0), now=1.0))
    assert router.in_flight(route.stages[0].node_id) == 1
    assert router.route("m", REQ).pipeline_id != route.pipeline_id
    bigger = plan([pipeline(f"m-r{i}", "m", (f"a{i}", 0, 4), (f"b{i}", 4, 8)) for i in range(3)])
    router.update(measured(bigger))
    assert router.in_flight(route.stages[0].node_id) == 1
    assert router.route("m", REQ).pipeline_id != route.pipeline_id


def test_ending_more_than_was_begun_never_goes_negative() -> None:
    router = replicas(2)
    route = router.route("m", REQ)
    router.end(route)
    assert router.in_flight() == 0
    assert router.in_flight("a0") == 0
    assert router.route("m", REQ) == route


def test_shared_nodes_make_every_pipeline_through_them_busier() -> None:
    p = plan(
        [
            pipeline("m-r0", "m", ("shared", 0, 4), ("x", 4, 8)),
            pipeline("m-r1", "m", ("shared", 0, 4), ("y", 4, 8)),
            pipeline("m-r2", "m", ("p", 0, 4), ("q", 4, 8)),
        ]
    )
    router = Router(measured(p, {"p": (11.0, 0.0, 1.0)}))
    first = router.route("m", REQ)
    assert first.pipeline_id == "m-r0"
    router.begin(first)
    assert router.route("m", REQ).pipeline_id == "m-r2"  # r1 shares the busy node


def test_unknown_models_raise_the_same_typed_error() -> None:
    with pytest.raises(NoSuchModel):
        replicas(1).route("other", REQ)


@given(
    latencies=st.lists(st.sampled_from([1.0, 2.0, 5.0]), min_size=2, max_size=6),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=40),
)
def test_the_decision_is_the_minimum_effective_cost_ties_by_id(
    latencies: list[float], ops: list[tuple[bool, int]]
) -> None:
    p = plan([pipeline(f"m-r{i}", "m", (f"n{i}", 0, 4)) for i in range(len(latencies))])
    router = Router(measured(p, {f"n{i}": (lat, 0.0, 1.0) for i, lat in enumerate(latencies)}))
    open_routes = []
    for begin, which in ops:
        if begin:
            route = router.route("m", REQ)
            router.begin(route)
            open_routes.append(route)
        elif open_routes:
            router.end(open_routes.pop(which % len(open_routes)))
        expected = min(
            (
                cost
                + inflight_cost(router.in_flight(pipe.stages[0].node_id))
                + ColdPenalty().link_ms,
                pid,
            )
            for cost, pid, pipe in router.state.cost_table("m")
        )
        got = router.route("m", REQ)
        assert (got.cost, got.pipeline_id) == pytest.approx(expected)


def test_full_pipelines_are_passed_over_and_all_full_is_saturated_not_broken() -> None:
    from hecate.core.errors import NoHealthyPipeline, Saturated

    router = replicas(3)
    best = router.route("m", REQ).pipeline_id
    other = router.route("m", REQ, full={best})
    assert other.pipeline_id != best
    with pytest.raises(Saturated) as refused:
        router.route("m", REQ, full={"m-r0", "m-r1", "m-r2"})
    assert refused.value.code == "rate_limited"
    assert not isinstance(refused.value, NoHealthyPipeline)  # load is not a failure


@given(
    latencies=st.lists(st.sampled_from([1.0, 2.0, 5.0, 9.0]), min_size=2, max_size=8),
    trips=st.lists(st.one_of(st.none(), st.floats(0.0, 40.0)), min_size=8, max_size=8),
    busy=st.lists(st.integers(0, 3), min_size=8, max_size=8),
    full=st.sets(st.integers(0, 7), max_size=7),
)
def test_with_round_trips_measured_the_decision_is_still_the_minimum_of_every_pipeline(
    latencies: list[float],
    trips: list[float | None],
    busy: list[int],
    full: set[int],
) -> None:
    """The decision walks pipelines in the order of the least cost each could have and
    stops early; it still picks what a walk over every pipeline would (the effective
    cost with its own measured round trip, in-flight load and ties by id)."""
    n = len(latencies)
    p = plan([pipeline(f"m-r{i}", "m", (f"n{i}", 0, 4)) for i in range(n)])
    router = Router(measured(p, {f"n{i}": (lat, 0.0, 1.0) for i, lat in enumerate(latencies)}))
    stages = {int(q.pipeline_id[3:]): q.stages for q in p.pipelines}
    for i in range(n):
        trip = trips[i]
        if trip is not None:
            router.measured(f"m-r{i}", trip / 1000, now=1.0)
        for _ in range(busy[i]):
            router.begin(Route(model_id="m", pipeline_id=f"m-r{i}", cost=0.0, stages=stages[i]))
    closed = {f"m-r{i}" for i in full if i < n}
    candidates = [
        (cost + inflight_cost(busy[int(pid[3:])]) + router.link(pipe, 1.0), pid)
        for cost, pid, pipe in router.state.cost_table("m")
        if pid not in closed
    ]
    if not candidates:
        return
    got = router.route("m", REQ, closed, now=1.0)
    assert (got.cost, got.pipeline_id) == pytest.approx(min(candidates))
