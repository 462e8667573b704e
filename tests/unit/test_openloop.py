"""The open-loop generator's arithmetic: when requests are due, which rates are
offered, and how late, failed and lost requests are counted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate.bench.openloop import Reply, due, ladder, percentile, summarize


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


def test_the_ladder_is_fractions_of_the_capacity_in_whole_requests() -> None:
    assert ladder(24_837.0, (0.1, 0.5, 1.2)) == [2484.0, 12418.0, 29804.0]
    assert ladder(3.0, (0.01,)) == [1.0]  # never an empty offer


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
