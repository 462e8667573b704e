"""The open-loop generator's arithmetic: when requests are due, how generators share a
schedule, how late, failed and lost requests are counted, what "served in full" means
and how the capacity search climbs past a path's limit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate_dev.bench.bus import capacity, ratio
from hecate_dev.bench.openloop import (
    CapacitySearch,
    Reply,
    due,
    percentile,
    served_in_full,
    share,
    summarize,
)


def test_requests_fall_due_on_their_schedule_and_never_beyond_the_total() -> None:
    assert due(-0.001, 100.0, 50) == 0
    assert due(0.0, 100.0, 50) == 1  # request 0 is due at once
    assert due(0.0099, 100.0, 50) == 1
    assert due(0.01, 100.0, 50) == 2  # exactly on request 1's slot
    assert due(0.255, 100.0, 50) == 26
    assert due(100.0, 100.0, 50) == 50


@given(st.floats(0, 10), st.floats(0, 10), st.floats(1, 50_000), st.integers(1, 10_000))
def test_the_schedule_only_moves_forward(a: float, b: float, rate: float, total: int) -> None:
    early, late = sorted((a, b))
    assert 0 <= due(early, rate, total) <= due(late, rate, total) <= total


@given(st.integers(1, 5_000), st.integers(1, 8))
def test_generators_share_a_schedule_exactly_once(total: int, of: int) -> None:
    shares = [list(share(total, k, of)) for k in range(of)]
    assert sorted(i for part in shares for i in part) == list(range(total))


def test_percentiles_are_nearest_rank() -> None:
    ordered = [float(i) for i in range(1, 101)]
    assert percentile(ordered, 0.5) == 50.0
    assert percentile(ordered, 0.99) == 99.0
    assert percentile([], 0.99) == 0.0


def test_latency_is_counted_from_the_scheduled_send() -> None:
    # 10 req/s for 1 s; the generator sent request 5 late (at 0.7 s instead of 0.5 s):
    # its 0.01 s reply counts as 0.21 s, not 0.01 s.
    sent = [i / 10 for i in range(10)]
    sent[5] = 0.7
    replies = {i: Reply(sent[i] + 0.01, True) for i in range(10)}
    figures = summarize(10.0, 1.0, 2.0, sent, replies)
    assert figures["ok"] == 10
    assert figures["p99_us"] == 210_000.0
    assert figures["p50_us"] == 10_000.0
    assert figures["send_lag_p99_us"] == 200_000.0


def test_failed_late_and_missing_requests_count_as_the_timeout() -> None:
    sent = [i / 100 for i in range(100)]
    replies = {i: Reply(sent[i] + 0.002, True) for i in range(100)}
    replies[10] = Reply(0.2, False)  # an error reply, however fast, is not a success
    replies[20] = Reply(0.2 + 2.5, True)  # past the 2 s timeout: counted as timed out
    del replies[30]  # never answered
    replies[99] = Reply(0.99 + 0.5, True)  # answered in time, but after the window
    figures = summarize(100.0, 1.0, 2.0, sent, replies)
    assert (figures["ok"], figures["failed"], figures["timed_out"]) == (97, 1, 2)
    assert figures["achieved_rps"] == 96.0  # correct replies within the offered second
    assert figures["p99_us"] == 2_000_000.0
    assert figures["p99_capped"] is True
    assert figures["p50_us"] == 2_000.0


def test_an_easy_load_is_served_in_full() -> None:
    sent = [i / 1000 for i in range(1000)]
    replies = {i: Reply(at + 0.0005, True) for i, at in enumerate(sent)}
    figures = summarize(1000.0, 1.0, 2.0, sent, replies)
    assert figures["achieved_rps"] == 1000.0
    assert (figures["failed"], figures["timed_out"], figures["p99_capped"]) == (0, 0, False)


def _point(ok: int, sent: int, p99_ms: float) -> dict[str, float]:
    return {"ok": ok, "sent": sent, "p99_us": p99_ms * 1000}


def test_served_in_full_needs_the_answers_and_the_latency() -> None:
    assert served_in_full(_point(1000, 1000, 40.0))
    assert served_in_full(_point(990, 1000, 100.0))  # both at their bound
    assert not served_in_full(_point(989, 1000, 40.0))  # more than 1 % not answered ok
    assert not served_in_full(_point(1000, 1000, 100.1))  # a queue growing through it
    assert not served_in_full(_point(0, 0, 0.0))  # nothing offered proves nothing


def _search_against(limit: float, search: CapacitySearch) -> list[float]:
    """Run ``search`` against a path that serves every rate up to ``limit``."""
    offered = []
    while (rate := search.next()) is not None:
        offered.append(rate)
        search.record(rate, rate <= limit)
        assert len(offered) < 100
    return offered


def test_the_search_climbs_past_its_start_until_two_rates_fail() -> None:
    # Started at 20,000 (a closed loop that its own generator held back), the search
    # still finds a limit at 41,700: the climb does not stop at the starting estimate.
    search = CapacitySearch(start=20_000, step=1.25, misses=2, refine=2, low=(2_000,))
    offered = _search_against(41_700, search)
    assert offered[:5] == [2_000, 20_000, 25_000, 31_250, 39_062]
    assert search.bounded
    assert search.capacity is not None
    assert 39_062 <= search.capacity <= 41_700
    assert 41_700 / search.capacity < 1.25 ** (1 / 4) + 1e-6  # two bisections


def test_one_failure_below_a_success_does_not_end_the_climb() -> None:
    search = CapacitySearch(start=1_000, step=2.0, misses=2, refine=0)
    fails = {2_000}  # a hiccup of the machine, not the limit
    while (rate := search.next()) is not None:
        search.record(rate, rate not in fails and rate <= 10_000)
    assert search.capacity == 8_000
    assert [r for r, _ in search.tried] == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000]


@given(st.floats(10, 1e5), st.floats(1, 1e5))
def test_the_search_never_reports_a_rate_that_failed(start: float, limit: float) -> None:
    search = CapacitySearch(start=start, step=1.3, misses=2, refine=3, ceiling=1e6)
    _search_against(limit, search)
    if search.capacity is not None:
        assert search.capacity <= limit
        assert search.bounded


def test_a_search_that_reaches_its_ceiling_is_only_a_floor() -> None:
    search = CapacitySearch(start=1_000, step=2.0, ceiling=5_000)
    _search_against(1e9, search)
    assert search.capacity == 4_000
    assert not search.bounded


def _swept(rate: float, served: bool, lag_us: float = 300.0) -> dict[str, object]:
    return {"offered_rps": rate, "served_in_full": served, "send_lag_p99_us": lag_us}


def test_a_capacity_is_exact_only_where_the_generators_kept_up_at_the_failure() -> None:
    kept_up = capacity([_swept(10_000, True), _swept(12_500, False), _swept(15_000, False)])
    assert kept_up == {
        "rps": 10_000,
        "exact": True,
        "failed_at_rps": 12_500,
        "send_lag_p99_us_at_failure": 300.0,
    }
    lagged = capacity([_swept(10_000, True), _swept(12_500, False, lag_us=80_000.0)])
    assert lagged["rps"] == 10_000
    assert not lagged["exact"]
    never_failed = capacity([_swept(10_000, True)])
    assert not never_failed["exact"]
    assert capacity([_swept(10_000, False)])["rps"] is None


def test_a_ratio_says_which_side_is_only_a_floor() -> None:
    exact = {"rps": 28_000.0, "exact": True}
    floor = {"rps": 41_000.0, "exact": False}
    routed = {"rps": 11_300.0, "exact": True}
    assert ratio(routed, exact) == (0.404, "exact")
    assert ratio(routed, floor) == (0.276, "at_most")
    assert ratio({**routed, "exact": False}, exact) == (0.404, "at_least")
    assert ratio({"rps": None, "exact": False}, exact) == (None, "unknown")


def test_bisection_stops_once_the_bracket_is_within_the_resolution() -> None:
    search = CapacitySearch(start=1_000, step=2.0, misses=1, refine=10, resolution=1.08)
    limit = 2_900.0
    while (rate := search.next()) is not None:
        search.record(rate, rate <= limit)
    best = search.capacity
    assert best is not None
    assert best <= limit
    above = min(r for r, ok in search.tried if not ok and r > best)
    assert above <= best * 1.08  # within the resolution: the capacity is within 8 % of 2,900
    assert best >= limit / 1.08
