"""The backlog of breaker reports a router keeps while nobody can hear them
(backlog.py), driven directly: no bus, no clock but the one passed in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate.bus.backlog import Backlog, Held
from hecate.wire.messages import OutcomeReport

# -- the breaker reports a router keeps while nobody can hear them -----------------------


def report(n: int) -> OutcomeReport:
    return OutcomeReport(target=f"n{n}", ok=False, code="timeout")


def targets(held: list[Held]) -> list[str]:
    return [h.report.target for h in held]


def test_the_backlog_keeps_the_newest_reports_up_to_its_bound_and_says_what_went() -> None:
    backlog = Backlog(max_age_s=30.0, max_len=3)
    dropped = [h for n in range(5) for h in backlog.hold(report(n), now=100.0)]
    assert targets(dropped) == ["n0", "n1"]
    assert backlog.expired(now=100.0) == []
    assert targets(backlog.take()) == ["n2", "n3", "n4"]
    assert len(backlog) == 0


def test_reports_nobody_heard_go_back_in_front_in_their_order() -> None:
    backlog = Backlog(max_age_s=30.0, max_len=4)
    for n in range(3):
        backlog.hold(report(n), now=100.0)
    batch = backlog.take()
    backlog.hold(report(9), now=100.0)  # made while the batch was out
    assert backlog.put_back([batch[0], batch[2]]) == []
    assert targets(backlog.take()) == ["n0", "n2", "n9"]


def test_a_report_older_than_the_breaker_window_is_dropped_not_delivered() -> None:
    backlog = Backlog(max_age_s=30.0, max_len=10)
    backlog.hold(report(0), now=100.0)
    backlog.hold(report(1), now=120.0)
    assert targets(backlog.expired(now=140.0)) == ["n0"]
    assert targets(backlog.take()) == ["n1"]


@given(st.lists(st.integers(0, 3), max_size=60), st.integers(1, 8))
def test_every_report_is_either_kept_delivered_or_counted_as_dropped(
    ops: list[int], limit: int
) -> None:
    """Nothing vanishes: kept + delivered + dropped = made, and the bound holds."""
    backlog = Backlog(max_age_s=30.0, max_len=limit)
    made = delivered = dropped = 0
    for n, op in enumerate(ops):
        if op < 2:
            made += 1
            dropped += len(backlog.hold(report(n), now=100.0))
        elif op == 2:
            dropped += len(backlog.expired(now=100.0))
            batch = backlog.take()
            bounced = batch[::2]
            delivered += len(batch) - len(bounced)
            dropped += len(backlog.put_back(bounced))
        assert len(backlog) <= limit
    assert made == len(backlog) + delivered + dropped
