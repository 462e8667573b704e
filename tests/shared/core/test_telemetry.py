"""EWMA telemetry and visible staleness, on an injected clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import NodeState, Sample, SwarmState, observe
from hecate.core.telemetry import beat_interval, ewma
from tests.support.builders import pipeline, plan


def test_the_first_sample_is_taken_as_is() -> None:
    s = observe(NodeState(), Sample(latency_ms=40.0, load=0.5, score=2.0), now=1.0)
    assert (s.latency_ms, s.load, s.score, s.last_seen) == (40.0, 0.5, 2.0, 1.0)


def test_later_samples_are_blended_with_alpha() -> None:
    s = observe(NodeState(), Sample(latency_ms=10.0), now=0.0)
    s = observe(s, Sample(latency_ms=20.0), now=1.0, alpha=0.25)
    assert s.latency_ms == pytest.approx(12.5)


def test_absent_fields_keep_their_estimate() -> None:
    s = observe(NodeState(), Sample(latency_ms=10.0, load=0.4), now=0.0)
    s = observe(s, Sample(load=0.8), now=1.0, alpha=0.5)
    assert s.latency_ms == 10.0
    assert s.load == pytest.approx(0.6)


@pytest.mark.parametrize("garbage", [math.nan, math.inf, -math.inf])
def test_non_finite_values_from_the_wire_are_dropped(garbage: float) -> None:
    s = observe(
        NodeState(latency_ms=10.0, load=0.1, score=1.0),
        Sample(latency_ms=garbage, load=garbage, score=garbage),
        now=5.0,
    )
    assert (s.latency_ms, s.load, s.score) == (10.0, 0.1, 1.0)
    assert s.last_seen == 5.0


def test_load_is_clamped_to_its_range_and_latency_to_non_negative() -> None:
    s = observe(NodeState(), Sample(latency_ms=-3.0, load=7.0), now=0.0)
    assert (s.latency_ms, s.load) == (0.0, 1.0)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5])
def test_alpha_outside_zero_one_is_refused(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        observe(NodeState(), Sample(latency_ms=1.0), now=0.0, alpha=alpha)


def test_a_sample_marks_a_down_node_alive() -> None:
    assert observe(NodeState(alive=False), Sample(), now=0.0).alive


def test_age_is_infinite_until_measured_then_counts_seconds() -> None:
    assert NodeState().age(100.0) == math.inf
    assert NodeState(last_seen=90.0).age(100.0) == 10.0


def test_stale_nodes_are_listed_not_hidden() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 2), ("b", 2, 4))])
    state = SwarmState.from_plan(p).observe("a", Sample(load=0.1), now=100.0)
    assert state.stale(now=101.0, max_age_s=5.0) == ["b"]
    assert state.stale(now=110.0, max_age_s=5.0) == ["a", "b"]
    assert state.ages(now=103.0) == {"a": 3.0, "b": math.inf}


def test_every_change_makes_a_new_state_with_a_higher_version() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 2))])
    s0 = SwarmState.from_plan(p)
    s1 = s0.observe("a", Sample(load=0.2), now=0.0)
    s2 = s1.mark("a", alive=False)
    assert s0.version < s1.version < s2.version
    assert s0.node("a").load is None  # the old snapshot is untouched


@given(
    values=st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=50),
    alpha=st.floats(min_value=0.01, max_value=1.0),
)
def test_the_estimate_stays_within_the_range_of_samples(values: list[float], alpha: float) -> None:
    est: float | None = None
    for v in values:
        est = ewma(est, v, alpha)
    assert est is not None
    assert min(values) - 1e-6 <= est <= max(values) + 1e-6


# -- heartbeat pacing ----------------------------------------------------------------------


def test_beats_keep_their_pace_within_the_budget_and_slow_past_it() -> None:
    assert beat_interval(0.1, 48, 2000.0, 1.0) == 0.1
    assert beat_interval(0.1, 200, 2000.0, 1.0) == 0.1  # 2,000 beats a second: the budget
    assert beat_interval(0.1, 1000, 2000.0, 1.0) == 0.5
    assert beat_interval(0.1, 10_000, 2000.0, 1.0) == 1.0  # never slower than most_s
    assert beat_interval(0.5, 10, 2000.0, 0.2) == 0.5  # never faster than configured


@given(
    base=st.floats(0.01, 2.0),
    nodes=st.integers(0, 100_000),
    budget=st.floats(1.0, 1e5),
    most=st.floats(0.01, 10.0),
)
def test_the_swarm_s_beats_stay_within_budget_unless_detection_would_suffer(
    base: float, nodes: int, budget: float, most: float
) -> None:
    every = beat_interval(base, nodes, budget, most)
    assert every >= base
    assert every <= max(base, most)
    if every < max(base, most):  # not held back by most_s: within the budget
        assert nodes / every <= budget * (1 + 1e-9)
