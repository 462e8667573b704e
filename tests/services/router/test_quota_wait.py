"""A request's wait for the quota desk (routing/quota.py), driven in memory."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from hecate.wire.messages import QuotaReply
from hecate_router.quota import Admit, AskDesk, QuotaState, QuotaWait, Refuse, holds


def wait(max_wait_ms: int = 0) -> QuotaWait:
    return QuotaWait(tenant="t", max_wait_ms=max_wait_ms, timeout_s=1.0, counters=Counter())


def test_admitted_starts_the_request() -> None:
    q = wait()
    assert q.start(0.0) == [AskDesk(None)]
    assert q.answered(QuotaReply(admitted=True), 0.1) == [Admit(unavailable=False)]
    assert q.state is QuotaState.DONE


def test_refused_says_when_and_hands_over_the_ticket() -> None:
    q = wait()
    q.start(0.0)
    [refuse] = q.answered(QuotaReply(admitted=False, retry_after_s=2.5, ticket=7), 0.1)
    assert isinstance(refuse, Refuse)
    assert (refuse.retry_after_s, refuse.ticket) == (2.5, 7)
    assert "over its quota" in refuse.message


def test_refused_past_the_horizon_names_no_ticket_it_was_not_given() -> None:
    q = wait()
    q.start(0.0)
    [refuse] = q.answered(QuotaReply(admitted=False, retry_after_s=300.0), 0.1)
    assert isinstance(refuse, Refuse)
    assert refuse.ticket is None
    assert "quota_ticket" not in refuse.message
    assert "as far ahead as the quota desk books; retry in 300.000 s" in refuse.message


def test_held_asks_again_with_its_ticket_at_the_booked_slot() -> None:
    q = wait(max_wait_ms=1000)
    q.start(0.0)
    reply = QuotaReply(admitted=False, retry_after_s=0.5, ticket=3, hold=True)
    assert q.answered(reply, 0.1) == []
    assert q.state is QuotaState.HELD
    assert q.tick(0.5) == []  # not yet
    assert q.tick(0.6) == [AskDesk(3)]
    assert q.answered(QuotaReply(admitted=True), 0.7) == [Admit(unavailable=False)]


def test_a_slot_further_off_than_the_caller_waits_is_refused_not_held() -> None:
    q = wait(max_wait_ms=100)
    q.start(0.0)
    reply = QuotaReply(admitted=False, retry_after_s=0.5, ticket=3, hold=True)
    assert isinstance(q.answered(reply, 0.1)[0], Refuse)


def test_without_the_desk_the_request_is_served_and_counted() -> None:
    q = wait()
    q.start(0.0)
    assert q.tick(0.5) == []
    assert q.tick(1.1) == [Admit(unavailable=True)]
    assert q.counters["quota_unavailable"] == 1
    assert q.answered(QuotaReply(admitted=False, retry_after_s=1.0), 1.2) == []  # too late


Event = tuple[str, float]


@given(
    st.lists(
        st.tuples(st.sampled_from(["admit", "refuse", "hold", "lost", "tick"]), st.floats(0, 3)),
        max_size=20,
    ),
    st.integers(0, 2000),
)
def test_whatever_comes_the_request_is_admitted_or_refused_once(
    events: list[Event], max_wait_ms: int
) -> None:
    q = wait(max_wait_ms)
    out = q.start(0.0)
    now = 0.0
    for kind, dt in events:
        now += dt
        if kind == "tick":
            out += q.tick(now)
        elif kind == "lost":
            out += q.unreachable()
        else:
            reply = QuotaReply(
                admitted=kind == "admit", retry_after_s=dt, ticket=1, hold=kind == "hold"
            )
            out += q.answered(reply, now)
    out += q.tick(now + 10.0)  # whatever is pending resolves: a held ask, then its deadline
    out += q.tick(now + 20.0)
    ends = [a for a in out if isinstance(a, Admit | Refuse)]
    assert len(ends) == 1
    assert q.state is QuotaState.DONE
    asks = [a for a in out if isinstance(a, AskDesk)]
    assert asks[0] == AskDesk(None)


def test_holding_is_within_what_the_caller_waits() -> None:
    assert holds(0.5, 500)
    assert not holds(0.501, 500)
