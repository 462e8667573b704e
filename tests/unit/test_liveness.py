"""The phi-accrual failure detector, on an injected clock: how long a silence each kind
of heartbeat history is allowed, and the properties that make it safe to rely on."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import FailureDetector, LivenessConfig

INTERVAL = 0.1  # what every node here declares


def fed(
    gaps: Sequence[float], config: LivenessConfig | None = None
) -> tuple[FailureDetector, float]:
    """A detector that heard node "n" at 0 and then after each gap; and the time of the
    last heartbeat."""
    d = FailureDetector(config)
    now = 0.0
    d.heartbeat("n", now, INTERVAL)
    for gap in gaps:
        now += gap
        d.heartbeat("n", now, INTERVAL)
    return d, now


# -- the figures the defaults give -----------------------------------------------------


def test_a_regular_100ms_heartbeater_is_declared_down_0_48_s_after_its_last_beat() -> None:
    d, last = fed([INTERVAL] * 50)
    # 0.1 (mean gap) + 0.1 (acceptable pause) + 5.612 (phi 8 in standard deviations) x 0.05
    # (the floor on the deviation): a SIGKILL is noticed within half a second.
    assert d.patience("n") == pytest.approx(0.4806, abs=1e-4)
    assert d.patience("n") < 0.5
    assert not d.suspected("n", last + 0.48)
    assert d.suspected("n", last + 0.481)


@pytest.mark.parametrize(
    ("history", "allowed"),
    [
        ("always 200 ms", 0.5806),
        ("always 400 ms", 0.7806),
        ("200 or 400 ms, alternating", 0.9612),
        ("uniform in 200-400 ms", 0.7215),
    ],
)
def test_a_node_whose_beats_came_200_to_400ms_apart_survives_a_500ms_gap(
    history: str, allowed: float
) -> None:
    rng = random.Random(1)
    gaps = {
        "always 200 ms": [0.2] * 100,
        "always 400 ms": [0.4] * 100,
        "200 or 400 ms, alternating": [0.2, 0.4] * 50,
        "uniform in 200-400 ms": [rng.uniform(0.2, 0.4) for _ in range(100)],
    }[history]
    d, last = fed(gaps)
    assert d.patience("n") == pytest.approx(allowed, abs=1e-3)
    assert not d.suspected("n", last + 0.5)


def test_one_stall_among_regular_beats_is_absorbed_by_the_floor_not_learnt() -> None:
    d, last = fed([INTERVAL] * 60 + [0.4] + [INTERVAL] * 39)
    assert not d.suspected("n", last + 0.4)  # the 300-400 ms stalls pass
    assert d.patience("n") == pytest.approx(0.4835, abs=1e-3)


def test_the_window_forgets_an_overload_once_the_node_is_regular_again() -> None:
    d, _ = fed([0.3] * 100)
    assert d.patience("n") > 0.6
    d, _ = fed([0.3] * 100 + [INTERVAL] * 100)
    assert d.patience("n") == pytest.approx(0.4806, abs=1e-4)


def test_until_it_has_enough_gaps_a_node_is_judged_by_its_declared_interval() -> None:
    d = FailureDetector()
    d.heartbeat("slow", 0.0, 1.0)
    d.heartbeat("slow", 0.05, 1.0)  # one gap, far shorter than declared: not yet a pattern
    # 1.0 + 0.1 + 5.612 x 0.05
    assert d.patience("slow") == pytest.approx(1.3806, abs=1e-4)
    assert not d.suspected("slow", 0.05 + 1.3)


def test_missed_intervals_are_always_allowed() -> None:
    d, last = fed([INTERVAL] * 50, LivenessConfig(min_missed=20))
    assert d.patience("n") == pytest.approx(2.0)
    assert not d.suspected("n", last + 1.99)
    assert d.suspected("n", last + 2.0)


def test_a_node_never_heard_or_forgotten_is_suspected() -> None:
    d, last = fed([INTERVAL] * 10)
    assert d.suspected("other", last)
    d.forget("n")
    assert d.suspected("n", last)
    d.heartbeat("n", last + 3.0, INTERVAL)  # back after a restart: a fresh history
    assert d.patience("n") == pytest.approx(0.4806, abs=1e-4)


# -- silence the observer did not watch ------------------------------------------------


def test_a_stall_of_the_observer_counts_against_nobody() -> None:
    d, last = fed([INTERVAL] * 50)
    d.blind(last + 0.9, 0.8)  # the observer's loop did not run for 0.8 s of that
    assert d.silence("n", last + 0.9) == pytest.approx(0.1)
    assert not d.suspected("n", last + 0.9)
    assert d.suspected("n", last + 0.9 + 0.4)  # what follows still counts


def test_a_stall_never_moves_a_heartbeat_into_the_future() -> None:
    d, last = fed([INTERVAL] * 50)
    d.blind(last + 0.2, 5.0)
    assert d.silence("n", last + 0.2) == 0.0


def test_silence_before_the_observer_was_back_on_the_bus_is_nobodys() -> None:
    d, last = fed([INTERVAL] * 50)
    d.deaf_until(last + 10.0)
    assert d.silence("n", last + 10.2) == pytest.approx(0.2)
    assert not d.suspected("n", last + 10.2)


@pytest.mark.parametrize(
    "bad",
    [
        {"threshold": 0.3},
        {"window": 0},
        {"min_std_s": 0.0},
        {"acceptable_pause_s": -0.1},
        {"max_silence_s": 0.0},
        {"min_missed": -1.0},
    ],
)
def test_a_config_that_could_suspect_a_node_heard_just_now_is_refused(
    bad: dict[str, float],
) -> None:
    with pytest.raises(ValueError, match="must"):
        LivenessConfig(**bad)  # type: ignore[arg-type]


# -- properties ------------------------------------------------------------------------

gap = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
histories = st.lists(gap, max_size=150)
silences = st.floats(min_value=0.0, max_value=60.0, allow_nan=False)
configs = st.builds(
    LivenessConfig,
    threshold=st.floats(min_value=0.5, max_value=16.0),
    window=st.integers(min_value=1, max_value=200),
    min_samples=st.integers(min_value=1, max_value=10),
    min_std_s=st.floats(min_value=1e-4, max_value=1.0),
    acceptable_pause_s=st.floats(min_value=0.0, max_value=2.0),
    min_missed=st.floats(min_value=0.0, max_value=10.0),
    max_silence_s=st.floats(min_value=0.01, max_value=30.0),
)


@given(histories, silences, silences, configs)
def test_phi_never_falls_as_the_silence_grows(
    gaps: list[float], a: float, b: float, config: LivenessConfig
) -> None:
    d, last = fed(gaps, config)
    early, late = sorted((a, b))
    assert d.phi("n", last + early) <= d.phi("n", last + late)
    if d.suspected("n", last + early):
        assert d.suspected("n", last + late)


@given(histories, configs)
def test_a_node_heard_just_now_is_never_suspected(
    gaps: list[float], config: LivenessConfig
) -> None:
    d, last = fed(gaps, config)
    assert not d.suspected("n", last)
    assert d.patience("n") > 0


@given(histories, configs)
def test_no_history_buys_more_than_the_maximum_silence(
    gaps: list[float], config: LivenessConfig
) -> None:
    d, last = fed(gaps, config)
    assert d.suspected("n", last + config.max_silence_s + 1e-9)  # + float rounding
    assert d.patience("n") <= config.max_silence_s


@given(histories, configs, silences)
def test_patience_is_where_suspicion_starts(
    gaps: list[float], config: LivenessConfig, silence: float
) -> None:
    d, last = fed(gaps, config)
    patience = d.patience("n")
    if silence >= patience + 1e-6:
        assert d.suspected("n", last + silence)
    elif silence <= patience - 1e-6:
        assert not d.suspected("n", last + silence)


@given(
    st.lists(st.floats(min_value=0.01, max_value=2.0), min_size=5, max_size=100),
    st.floats(min_value=1.0, max_value=5.0),
    silences,
)
def test_more_jitter_in_the_history_means_later_suspicion(
    gaps: list[float], spread: float, silence: float
) -> None:
    """The same mean gap with its deviations scaled up: never suspected sooner."""
    mean = math.fsum(gaps) / len(gaps)
    if min(gaps) < mean:  # no gap may become negative
        spread = min(spread, mean / (mean - min(gaps)))
    jittery = [max(0.0, mean + spread * (g - mean)) for g in gaps]
    calm_d, calm_last = fed(gaps)
    jit_d, jit_last = fed(jittery)
    assert jit_d.patience("n") >= calm_d.patience("n") - 1e-9
    if jit_d.suspected("n", jit_last + silence):
        assert calm_d.suspected("n", calm_last + silence)


@given(st.lists(st.floats(min_value=0.2, max_value=0.4), min_size=5, max_size=150))
def test_any_history_of_200_to_400ms_gaps_survives_500ms_of_silence(gaps: list[float]) -> None:
    d, last = fed(gaps)
    assert not d.suspected("n", last + 0.5)
