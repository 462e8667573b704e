"""The phi-accrual failure detector, on an injected clock: how long a silence each kind
of heartbeat history is allowed, and the properties that make it safe to rely on."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate_telemetry.liveness import FailureDetector, Link, LivenessConfig

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
        {"loading_silence_s": 0.0},
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


# -- starting: the observer's own link, and a node loading its ranges -------------------

#: Telemetry's monotonic clock when ``make run`` logged "link silent: judging nobody
#: for_s=193.1": the machine had been up for minutes, telemetry for well under one.
STARTED = 193.1
PERIOD = INTERVAL / 2  # telemetry sweeps twice per declared interval


def test_telemetry_that_just_started_reports_no_silence_of_its_link() -> None:
    # Proven by the PING that made telemetry ready, sent at STARTED; then one PING per
    # sweep, each answered before the next sweep.
    link = Link(proven_at=STARTED)
    now, sent = STARTED, STARTED
    for _ in range(40):  # two seconds of sweeps
        now += PERIOD
        link.answered(sent)
        assert link.sweep(now, PERIOD) is None, f"silent for {link.silent_for(now):.1f} s"
        sent = now
    assert link.deaf_sweeps == 0
    assert link.silent_for(now) == pytest.approx(PERIOD)


def test_a_link_that_stops_answering_is_silent_from_its_last_proof_on() -> None:
    link = Link(proven_at=STARTED)
    now = STARTED
    news = []
    for _ in range(10):  # 0.6 s of sweeps 60 ms apart, no PONG at all
        now += 0.06
        news.append(link.sweep(now, 0.06))
    assert news.count("silent") == 1  # logged once per spell
    assert link.silent_for(now) == pytest.approx(0.6)  # from STARTED, not from 0
    assert link.deaf_sweeps == 6  # the sweeps past 0.25 s, from 0.30 s on
    link.answered(now - 0.06)
    assert link.sweep(now + 0.06, 0.06) == "answers again"


def test_a_stall_of_the_observer_is_no_silence_of_its_link() -> None:
    link = Link(proven_at=STARTED)
    link.blind(STARTED + 1.0, 0.9)  # its loop did not run for 0.9 s of the first second
    assert link.sweep(STARTED + 1.0, PERIOD) is None
    assert link.silent_for(STARTED + 1.0) == pytest.approx(0.1)


@given(
    st.floats(min_value=0.0, max_value=1e7),
    st.lists(st.floats(min_value=0.001, max_value=0.2), max_size=60),
)
def test_a_link_is_never_silent_for_longer_than_it_was_watched(
    started: float, sweeps: list[float]
) -> None:
    link = Link(proven_at=started)
    now = started
    for gap in sweeps:
        now += gap
        link.sweep(now, gap)
        assert link.silent_for(now) <= now - started + 1e-9


def loading_node(
    gaps: Sequence[float], config: LivenessConfig | None = None
) -> tuple[FailureDetector, float]:
    """Node "n" as ``make run`` started alpha-2: two beats at its pace, then beats
    saying it is loading, ``gaps`` apart (its event loop held by the load); and the time
    of the last one."""
    d = FailureDetector(config or LivenessConfig(min_missed=3.0))
    d.heartbeat("n", 0.0, INTERVAL)
    d.heartbeat("n", INTERVAL, INTERVAL, loading=True)
    now = INTERVAL
    for gap in gaps:
        assert not d.suspected("n", now + gap - 1e-9), f"down {gap} s into a load"
        now += gap
        d.heartbeat("n", now, INTERVAL, loading=True)
    return d, now


def test_a_node_that_said_it_is_loading_is_not_called_down_while_its_beats_come_late() -> None:
    # Heard of SmolLM2's end stages at make run: 0.3-0.5 s between beats while loading on
    # a quiet machine, 0.6-0.9 s on a busy one, where a starting node is given 0.48 s.
    d, _ = loading_node([0.6, 1.5, 0.05, 3.0, 0.3, 7.0])
    assert d.loading("n")
    assert d.patience("n") == LivenessConfig().loading_silence_s


def test_a_load_that_hangs_is_a_death() -> None:
    d, last = loading_node([0.1, 0.1])
    allowed = d.config.loading_silence_s
    assert not d.suspected("n", last + allowed - 1e-6)
    assert d.suspected("n", last + allowed)


def test_once_loaded_a_node_is_judged_at_its_pace_and_its_load_taught_nothing() -> None:
    d, last = loading_node([0.6, 1.5, 3.0])
    d.heartbeat("n", last + 2.0, INTERVAL)  # loaded: its next beat says so
    assert not d.loading("n")
    # The gaps while loading are neither held against it nor bought it rope.
    assert d.patience("n") == pytest.approx(0.4806, abs=1e-4)
    assert d.suspected("n", last + 2.0 + 0.49)


@given(
    st.lists(st.floats(min_value=0.0, max_value=9.9), max_size=50),
    st.floats(min_value=0.0, max_value=9.9),
)
def test_a_loading_node_beating_at_any_pace_within_its_allowance_is_never_down(
    gaps: list[float], silence: float
) -> None:
    d, last = loading_node(gaps)
    assert not d.suspected("n", last + silence)


# -- a node that changes its pace ----------------------------------------------------------


def test_a_node_that_slows_its_beats_says_so_first_and_is_judged_by_the_new_pace() -> None:
    """A node slowing from 100 ms to 1 s beats as its swarm grows declares 1 s in the
    beat before the first long gap: that gap is not silence, and the history learnt at
    100 ms is not what the new pace is judged by."""
    d, last = fed([INTERVAL] * 50)
    d.heartbeat("n", last + INTERVAL, 1.0)  # the beat that declares the new pace
    last += INTERVAL
    assert not d.suspected("n", last + 1.0)
    assert d.suspected("n", last + 1.0 + d.patience("n") + 0.01)
    for _ in range(20):  # settled at the new pace: judged as a 100 ms beater is, at 1 s
        last += 1.0
        d.heartbeat("n", last, 1.0)
    assert d.patience("n") == pytest.approx(1.0 + 0.1 + 5.612 * 0.05, abs=1e-3)
    assert not d.suspected("n", last + 1.37)
    assert d.suspected("n", last + 1.39)


def test_a_pace_that_barely_moves_keeps_the_history() -> None:
    d, last = fed([INTERVAL] * 50)
    before = d.patience("n")
    d.heartbeat("n", last + INTERVAL, INTERVAL * 1.2)
    assert d.patience("n") == pytest.approx(before, abs=0.01)
