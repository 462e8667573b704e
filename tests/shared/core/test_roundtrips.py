"""A router prefers the pipeline it measured faster: its own step times are the link
term of a pipeline's cost, forgotten when old, and an unmeasured pipeline pays a fixed
allowance (so a pipeline measured slower than that is passed over for one not tried)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import ColdPenalty, NodeState, Router, RoutingRequest
from hecate.core.chooser import Chooser
from hecate.core.cost import inflight_cost, link_cost
from hecate.core.roundtrips import RoundTrips
from tests.support.builders import measured, pipeline, plan

REQ = RoutingRequest()
W = 5.0  # the window
ALLOWANCE = ColdPenalty().link_ms
# The wan bench's shape: two 3-stage copies, the far one r0 (the one a tie goes to).
FAR, NEAR = "m-r0", "m-r1"
PLAN = plan(
    [
        pipeline(FAR, "m", ("far-0", 0, 4), ("far-1", 4, 8), ("far-2", 8, 12)),
        pipeline(NEAR, "m", ("near-0", 0, 4), ("near-1", 4, 8), ("near-2", 8, 12)),
    ]
)
COMPUTE_S = 0.030  # three stages at telemetry's 10 ms


def router() -> Router:
    return Router(measured(PLAN), window_s=W)


def generate(r: Router, now: float, far_ms: float = 120.0, near_ms: float = 2.0) -> str:
    """One sequential generation of eight steps along the route chosen at ``now``."""
    route = r.route("m", REQ, now=now)
    extra = far_ms if route.pipeline_id == FAR else near_ms
    for step in range(8):
        r.measured(route.pipeline_id, COMPUTE_S + extra / 1000, now + 0.01 * step)
    return route.pipeline_id


# -- the windows -----------------------------------------------------------------------


def test_the_figure_is_the_least_step_of_the_window_not_a_queued_one() -> None:
    trips = RoundTrips(W)
    for ms in (400.0, 35.0, 900.0, 250.0):  # queued steps around one quiet one
        trips.sample("p", ms, 1.0)
    assert trips.least_ms("p", 1.0) == 35.0


def test_a_slower_link_shows_within_two_windows() -> None:
    trips = RoundTrips(W)
    trips.sample("p", 30.0, 0.0)
    for t in range(1, 12):
        trips.sample("p", 90.0, float(t))
    assert trips.least_ms("p", 11.0) == 90.0


def test_a_pipeline_without_steps_for_two_windows_is_unmeasured() -> None:
    trips = RoundTrips(W)
    trips.sample("p", 30.0, 0.0)
    assert trips.least_ms("p", 2 * W - 0.01) == 30.0
    assert trips.least_ms("p", 2 * W) is None
    trips.forget(2 * W)
    assert "p" not in trips


@given(
    steps=st.lists(
        st.tuples(st.floats(0, 1_000, allow_nan=False), st.floats(0, 1.0)), min_size=1, max_size=30
    ),
    later=st.floats(2 * W, 1_000),
)
def test_a_forgotten_measurement_counts_exactly_as_unmeasured(
    steps: list[tuple[float, float]], later: float
) -> None:
    r, fresh = router(), router()
    t = 0.0
    for ms, gap in steps:
        t += gap
        r.measured(FAR, ms / 1000, t)
    at = t + later
    assert r.route("m", REQ, now=at) == fresh.route("m", REQ, now=at)


# -- the cost term ---------------------------------------------------------------------


@given(
    a=st.floats(0, 10_000, allow_nan=False),
    b=st.floats(0, 10_000, allow_nan=False),
    compute=st.floats(0, 10_000, allow_nan=False),
)
def test_the_link_term_is_never_less_for_a_slower_step(a: float, b: float, compute: float) -> None:
    slow, fast = max(a, b), min(a, b)
    assert link_cost(slow, compute) >= link_cost(fast, compute)


@given(a=st.floats(0, 5.0, allow_nan=False), b=st.floats(0, 5.0, allow_nan=False))
def test_a_pipeline_measured_slower_never_costs_less_than_measured_faster(
    a: float, b: float
) -> None:
    slow, fast = router(), router()
    slow.measured(NEAR, max(a, b), 1.0)
    fast.measured(NEAR, min(a, b), 1.0)
    cost_slow = slow.route("m", REQ, full={FAR}, now=1.0).cost
    cost_fast = fast.route("m", REQ, full={FAR}, now=1.0).cost
    assert cost_slow >= cost_fast


def test_a_measured_step_stands_for_the_latencies_the_nodes_report() -> None:
    r = router()
    base = r.state.cost_table("m")[0][0]  # the nodes report 30 ms in all
    assert r.route("m", REQ, full={FAR}, now=1.0).cost == pytest.approx(base + ALLOWANCE)
    r.measured(NEAR, 0.080, 1.0)
    assert r.route("m", REQ, full={FAR}, now=1.0).cost == pytest.approx(base + 50.0)
    # A step quicker than the nodes' figures (theirs average in prefills and warm-ups).
    r.measured(NEAR, 0.012, 1.5)
    assert r.route("m", REQ, full={FAR}, now=1.5).cost == pytest.approx(base - 18.0)


# -- the decision ----------------------------------------------------------------------


def test_sequential_generations_go_to_the_nearer_pipeline() -> None:
    r = router()
    picks = [generate(r, now=0.5 * i) for i in range(40)]  # 20 s: far is forgotten meanwhile
    assert picks[0] == FAR  # nothing measured: the tie goes to r0
    assert picks[1:] == [NEAR] * 39  # measured 120 ms out: the untried one is cheaper


def test_a_near_pipeline_that_got_slow_loses_to_the_forgotten_far_one() -> None:
    r = router()
    assert generate(r, 0.0) == FAR
    slow = COMPUTE_S + (ALLOWANCE + 100) / 1000
    for tenth in range(10, 110):  # near serves every step, 2 ms out, then slow from 6 s
        assert r.route("m", REQ, now=tenth / 10).pipeline_id == NEAR
        r.measured(NEAR, COMPUTE_S + 0.002 if tenth < 60 else slow, tenth / 10)
    # A window of nothing but slow steps: near is past the allowance, and far, long
    # forgotten, is tried again.
    assert r.route("m", REQ, now=11.0).pipeline_id == FAR
    # Within the allowance, near keeps the traffic: an untried copy could gain no more.
    r2 = router()
    generate(r2, 0.0)
    for tenth in range(10, 120):
        r2.measured(NEAR, COMPUTE_S + (ALLOWANCE - 5) / 1000, tenth / 10)
    assert r2.route("m", REQ, now=12.0).pipeline_id == NEAR


def test_load_still_spreads_work_onto_the_farther_pipeline() -> None:
    r = router()
    generate(r, 0.0)
    generate(r, 1.0)
    picks = []
    for _ in range(6):
        route = r.route("m", REQ, now=1.5)
        r.begin(route)
        picks.append(route.pipeline_id)
    assert picks[0] == NEAR
    assert FAR in picks


def test_a_splice_is_not_measured_and_a_changed_pipeline_is_forgotten() -> None:
    r = router()
    r.measured(f"{FAR}~splice", 5.0, 1.0)
    assert f"{FAR}~splice" not in r.round_trips
    r.measured(FAR, 0.2, 1.0)
    r.measured(NEAR, 0.04, 1.0)
    moved = plan(
        [
            pipeline(FAR, "m", ("far-0", 0, 4), ("far-1", 4, 8), ("far-2", 8, 12)),
            pipeline(NEAR, "m", ("near-0", 0, 4), ("other", 4, 8), ("near-2", 8, 12)),
        ]
    )
    r.update(measured(moved))
    assert FAR in r.round_trips
    assert NEAR not in r.round_trips  # measured on a node it no longer has


def test_the_chooser_prefers_the_measured_faster_copy_and_still_fails_over() -> None:
    c = Chooser(window_s=W)
    nodes = {n.node_id: NodeState(latency_ms=10.0, load=0.0, score=1.0) for n in PLAN.nodes}
    c.observe(PLAN, nodes, now=0.0)
    assert c.choose("m", REQ, now=0.0)[0].pipeline_id == FAR
    c.measured(FAR, COMPUTE_S + 0.120, 0.1)
    assert c.choose("m", REQ, now=0.2)[0].pipeline_id == NEAR
    c.measured(NEAR, COMPUTE_S + 0.002, 0.3)
    # Its near copy broken, the far one serves whatever was measured of it.
    c.observe(PLAN, {**nodes, "near-1": NodeState(alive=False)}, now=0.4)
    assert c.choose("m", REQ, now=0.4)[0].pipeline_id == FAR
    # Both broken: a splice, which has no measurement of its own.
    c.observe(
        PLAN,
        {**nodes, "near-1": NodeState(alive=False), "far-2": NodeState(alive=False)},
        now=0.5,
    )
    route, degraded = c.choose("m", REQ, now=0.5)
    assert route.pipeline_id.endswith("~splice")
    assert not degraded
    c.measured(route.pipeline_id, 1.0, 0.6)
    assert c.router is not None
    assert route.pipeline_id not in c.router.round_trips


@given(
    latencies=st.lists(st.sampled_from([1.0, 5.0, 40.0]), min_size=2, max_size=5),
    steps=st.lists(st.tuples(st.integers(0, 4), st.floats(0, 0.3)), max_size=10),
    busy=st.lists(st.integers(0, 4), max_size=6),
)
def test_the_decision_is_the_least_cost_with_in_flight_and_measured_steps(
    latencies: list[float], steps: list[tuple[int, float]], busy: list[int]
) -> None:
    p = plan([pipeline(f"m-r{i}", "m", (f"n{i}", 0, 4)) for i in range(len(latencies))])
    r = Router(measured(p, {f"n{i}": (lat, 0.0, 1.0) for i, lat in enumerate(latencies)}))
    for which, seconds in steps:
        r.measured(f"m-r{which % len(latencies)}", seconds, 1.0)
    for which in busy:
        r.begin(r.route("m", REQ, full={f"m-r{which % len(latencies)}"} if which else ()))
    expected = min(
        (base + inflight_cost(r.in_flight(pipe.stages[0].node_id)) + r.link(pipe, 1.0), pid)
        for base, pid, pipe in r.state.cost_table("m")
    )
    got = r.route("m", REQ, now=1.0)
    assert (got.cost, got.pipeline_id) == pytest.approx(expected)


# An operation on a router: a step measured on a pipeline, or a decision, at a time
# that only moves forward (by up to three windows at once).
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["sample-far", "sample-near", "decide"]),
        st.floats(0, 3 * W, allow_nan=False),
        st.floats(0, 0.5, allow_nan=False),
    ),
    max_size=40,
)


@given(_OPS)
def test_a_kept_link_term_is_always_what_asking_again_would_give(
    ops: list[tuple[str, float, float]],
) -> None:
    """The router keeps each pipeline's link term until a sample, a snapshot or a window
    boundary changes it: every decision sees what computing it afresh would give."""
    r, now = router(), 0.0
    for op, step, seconds in ops:
        now += step
        if op == "decide":
            for p in PLAN.pipelines:
                fresh = link_cost(r.round_trips.least_ms(p.pipeline_id, now), COMPUTE_S * 1000)
                assert r.link(p, now) == pytest.approx(fresh)
        else:
            r.measured(FAR if op == "sample-far" else NEAR, seconds, now)


@given(
    st.floats(0, 4 * W, allow_nan=False),
    st.floats(0, 4 * W, allow_nan=False),
    st.floats(0, 1.0, allow_nan=False),
    st.floats(0, 1.0, allow_nan=False),
)
def test_a_figure_holds_until_the_time_lately_names(
    first: float, gap: float, a: float, b: float
) -> None:
    trips = RoundTrips(W)
    trips.sample(NEAR, a, first)
    trips.sample(NEAR, b, first + gap)
    at = first + gap
    value, until = trips.lately(NEAR, at)
    assert value == trips.least_ms(NEAR, at)
    assert until > at
    # Anywhere before ``until`` the figure is the same; at ``until`` it may change.
    for t in (at, (at + min(until, at + 10 * W)) / 2):
        assert trips.least_ms(NEAR, t) == value
