"""``llm-overload``'s own verdicts: full rate is the same run's rate before the kill,
the swarm is back at it within 2 s of the killed node's first heartbeat or the check
fails, and any node declared down but the killed one fails the run. Pure: times in,
checks and figures out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate_dev.chaos.acceptance import Expect, judge
from hecate_dev.chaos.overload import downs_by_node, findings, full_rate_after, tokens_per_s


def _steady(start: float, end: float, per_s: float) -> list[float]:
    """Tokens at a steady ``per_s`` from ``start`` to ``end``."""
    n = round((end - start) * per_s)
    return [start + i / per_s for i in range(n)]


def test_the_rate_counts_tokens_in_a_half_open_span() -> None:
    times = [0.0, 0.5, 1.0, 1.5, 2.0]
    assert tokens_per_s(times, 0.0, 2.0) == 2.0
    assert tokens_per_s(times, 0.0, 0.0) == 0.0


def test_full_rate_is_the_first_one_second_window_at_the_floor() -> None:
    # 20 tokens/s, silence from 10 to 13, 20 tokens/s again
    times = _steady(0.0, 10.0, 20.0) + _steady(13.0, 20.0, 20.0)
    assert full_rate_after(times, 5.0, 16.0) == 0.0  # already at full rate
    delay = full_rate_after(times, 11.0, 16.0)
    assert delay is not None
    # the window (12.75, 13.75] is the first to hold 16 tokens (13.0 to 13.75)
    assert delay == pytest.approx(1.75)
    assert full_rate_after(times, 11.0, 100.0) is None
    assert full_rate_after([], 0.0, 1.0) is None


BACK_AT_WORK = [(13.0, ("alpha-0", "alpha-1", "alpha-2"))]  # started after the return


def test_a_swarm_back_at_full_rate_at_once_passes() -> None:
    times = _steady(0.0, 20.0, 10.0)  # the kill changed nothing a caller could see
    events = [(10.1, "alpha-1", "down"), (12.5, "alpha-1", "up")]
    checks, notes = findings(
        times, killed_at=10.0, back_at=12.0, victim="alpha-1", events=events, answers=BACK_AT_WORK
    )
    assert all(checks.values()), checks
    assert notes["answers_through_the_killed_node_after_its_return"] == 1.0
    assert notes["tokens_per_s_before_kill"] == 10.0
    assert notes["full_rate_s_after_heartbeat"] == 0.0
    assert notes["down_events_alpha-1"] == 1.0


def test_full_rate_kept_up_by_the_survivors_alone_is_not_the_node_back() -> None:
    """The surviving pipeline streams at the old rate by itself: unless a generation
    started after the return went through the restarted node, it is not back at work
    (one answered through it before the kill, or started before its return, is not)."""
    times = _steady(0.0, 20.0, 10.0)
    before: list[tuple[float, tuple[str, ...]]] = [
        (2.0, ("alpha-0", "alpha-1", "alpha-2")),
        (11.5, ("alpha-0", "alpha-1")),
    ]
    others: list[tuple[float, tuple[str, ...]]] = [(14.0, ("beta-0", "beta-1", "beta-2"))]
    checks, notes = findings(times, 10.0, 12.0, "alpha-1", events=[], answers=before + others)
    assert checks["full_rate_within_2s_of_its_return"] is True
    assert checks["killed_node_carries_generations_again"] is False
    assert notes["answers_through_the_killed_node_after_its_return"] == 0.0


def test_a_swarm_that_stays_slow_after_the_return_fails() -> None:
    # 10 tokens/s, then 2 tokens/s for a minute after the kill (circuits held open)
    times = _steady(0.0, 10.0, 10.0) + _steady(10.0, 70.0, 2.0)
    checks, notes = findings(times, 10.0, back_at=12.0, victim="alpha-1", events=[])
    assert checks["full_rate_within_2s_of_its_return"] is False
    assert "full_rate_s_after_heartbeat" not in notes
    # back at full rate 5 s after the heartbeat: still too late
    times = _steady(0.0, 10.0, 10.0) + _steady(17.0, 30.0, 10.0)
    checks, notes = findings(times, 10.0, back_at=12.0, victim="alpha-1", events=[])
    assert checks["full_rate_within_2s_of_its_return"] is False
    assert 4.0 < notes["full_rate_s_after_heartbeat"] <= 5.0


def test_a_busy_node_declared_down_fails_the_run_through_its_checks() -> None:
    times = _steady(0.0, 20.0, 10.0)
    events = [(5.0, "alpha-0", "down"), (10.1, "alpha-1", "down"), (6.0, "alpha-0", "up")]
    checks, notes = findings(times, 10.0, 12.0, "alpha-1", events)
    assert checks["no_node_down_but_the_killed"] is False
    assert notes["down_events_alpha-0"] == 1.0
    figures = {"lost": 0, "wrong": 0, "errors": 0, "checks": checks, "evidence": {"x": 1}}
    assert judge(figures, Expect((), "test"))["its_own_checks"] is False


def test_a_node_never_heard_again_or_no_token_before_the_kill_fails() -> None:
    times = _steady(0.0, 20.0, 10.0)
    checks, _ = findings(times, 10.0, back_at=None, victim="alpha-1", events=[])
    assert checks["killed_node_heartbeats_again"] is False
    assert checks["full_rate_within_2s_of_its_return"] is False
    checks, _ = findings(_steady(11.0, 20.0, 10.0), 10.0, 12.0, "alpha-1", [])
    assert checks["tokens_streamed_before_the_kill"] is False
    assert checks["full_rate_within_2s_of_its_return"] is False


def test_downs_are_counted_by_node() -> None:
    events = [(1.0, "a", "down"), (2.0, "a", "up"), (3.0, "a", "down"), (4.0, "b", "up")]
    assert downs_by_node(events) == {"a": 2}


@given(
    gaps=st.lists(st.floats(0.001, 0.5), min_size=1, max_size=200),
    since=st.floats(0.0, 20.0),
    floor=st.floats(0.5, 30.0),
)
def test_the_window_found_holds_the_floor_and_none_earlier_does(
    gaps: list[float], since: float, floor: float
) -> None:
    times: list[float] = []
    at = 0.0
    for gap in gaps:
        at += gap
        times.append(at)

    def count(start: float) -> int:
        return sum(1 for t in times if start < t <= start + 1.0)

    delay = full_rate_after(times, since, floor)
    if delay is None:
        # no window start from ``since`` on holds the floor (checked on a fine grid)
        assert all(count(since + k / 100) < floor for k in range(2500))
        return
    assert delay >= 0
    assert count(since + delay) >= floor
    assert all(count(since + k / 100) < floor for k in range(int(delay * 100)))
