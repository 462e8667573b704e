"""Token buckets (GCRA) that book a rejected caller's slot, and per-tenant quotas."""

from __future__ import annotations

import heapq
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.resilience import Admission, Quota, TokenBucket


def herd(bucket: TokenBucket, callers: int, at: float = 0.0) -> list[Admission]:
    return [bucket.try_acquire(at) for _ in range(callers)]


# -- burst, then rate ------------------------------------------------------------------


def test_a_burst_is_admitted_at_once_then_the_rate_applies() -> None:
    answers = herd(TokenBucket(100.0, 100.0), 1000)
    assert all(a.admitted for a in answers[:100])
    assert not any(a.admitted for a in answers[100:])
    assert answers[100].retry_after_s == pytest.approx(0.01)
    assert answers[999].retry_after_s == pytest.approx(9.0)


def test_each_rejected_caller_of_a_herd_is_told_its_own_slot() -> None:
    answers = herd(TokenBucket(100.0, 100.0), 1000)
    for i, answer in enumerate(answers[100:], start=1):
        assert answer.retry_after_s == pytest.approx(i * 0.01)
        assert answer.ticket is not None
    assert len({a.ticket for a in answers[100:]}) == 900


def test_a_full_bucket_refills_at_the_rate() -> None:
    bucket = TokenBucket(10.0, 5.0)
    assert all(a.admitted for a in herd(bucket, 5))
    assert not bucket.try_acquire(0.0).admitted
    bucket = TokenBucket(10.0, 5.0, book=False)
    herd(bucket, 5)
    assert bucket.try_acquire(0.1).admitted
    assert not bucket.try_acquire(0.1).admitted
    assert all(a.admitted for a in herd(bucket, 5, at=10.0))  # refilled to the burst, no more
    assert not bucket.try_acquire(10.0).admitted


def test_a_cost_above_one_takes_proportionally_longer() -> None:
    bucket = TokenBucket(10.0, 10.0, book=False)
    assert bucket.try_acquire(0.0, cost=10.0).admitted
    answer = bucket.try_acquire(0.0, cost=4.0)
    assert not answer.admitted
    assert answer.retry_after_s == pytest.approx(0.4)
    assert bucket.conforms_at(0.0, 4.0) == pytest.approx(0.4)
    assert bucket.try_acquire(0.4, cost=4.0).admitted


# -- booking ---------------------------------------------------------------------------


def replay_herd(bucket: TokenBucket, callers: int) -> tuple[int, int]:
    """Every caller arrives at 0 and, when refused, returns at exactly its retry_after."""
    attempts = 0
    admitted = 0
    order = itertools.count()
    queue: list[tuple[float, int, int | None]] = [(0.0, next(order), None) for _ in range(callers)]
    rejected_twice = 0
    seen: set[int] = set()
    while queue:
        now, _, ticket = heapq.heappop(queue)
        attempts += 1
        answer = bucket.try_acquire(now, ticket=ticket)
        if answer.admitted:
            admitted += 1
            continue
        if ticket is not None:
            rejected_twice += 1
        assert answer.ticket is not None
        assert answer.ticket not in seen
        seen.add(answer.ticket)
        heapq.heappush(queue, (now + answer.retry_after_s, next(order), answer.ticket))
    assert admitted == callers
    return attempts, rejected_twice


def test_with_booking_every_caller_returning_on_time_is_admitted_none_rejected_twice() -> None:
    attempts, rejected_twice = replay_herd(TokenBucket(100.0, 100.0), 1000)
    assert rejected_twice == 0
    assert attempts == 1900  # 1000 arrivals + 900 returns: the floor for reject-and-retry


def test_a_caller_returning_early_with_its_ticket_is_told_the_remaining_wait() -> None:
    bucket = TokenBucket(1.0, 1.0)
    assert bucket.try_acquire(0.0).admitted
    first = bucket.try_acquire(0.0)
    assert (first.admitted, first.retry_after_s) == (False, 1.0)
    early = bucket.try_acquire(0.25, ticket=first.ticket)
    assert not early.admitted
    assert early.retry_after_s == pytest.approx(0.75)
    assert early.ticket == first.ticket
    assert bucket.try_acquire(1.0, ticket=first.ticket).admitted


def test_an_early_return_does_not_take_capacity_again() -> None:
    bucket = TokenBucket(1.0, 1.0)
    bucket.try_acquire(0.0)
    booked = bucket.try_acquire(0.0)
    tat = bucket.tat
    for t in (0.1, 0.5, 0.9):
        bucket.try_acquire(t, ticket=booked.ticket)
    assert bucket.tat == tat
    assert bucket.try_acquire(1.0, ticket=booked.ticket).admitted
    assert bucket.tat == tat


def test_a_booking_holds_its_slot_against_newcomers() -> None:
    bucket = TokenBucket(1.0, 1.0)
    bucket.try_acquire(0.0)
    booked = bucket.try_acquire(0.0)
    newcomer = bucket.try_acquire(1.0)  # arrives exactly at the booked slot
    assert not newcomer.admitted
    assert newcomer.retry_after_s == pytest.approx(1.0)
    assert bucket.try_acquire(1.0, ticket=booked.ticket).admitted


def test_without_booking_retry_after_is_exact_but_returning_callers_compete() -> None:
    bucket = TokenBucket(100.0, 100.0, book=False)
    answers = herd(bucket, 1000)
    rejected = answers[100:]
    assert all(a.ticket is None for a in rejected)
    assert all(a.retry_after_s == pytest.approx(0.01) for a in rejected)
    back = herd(bucket, len(rejected), at=0.01)  # all 900 come back together
    assert sum(a.admitted for a in back) == 1
    assert all(a.retry_after_s == pytest.approx(0.01) for a in back if not a.admitted)


def test_a_ticket_is_single_use() -> None:
    bucket = TokenBucket(1.0, 1.0)
    bucket.try_acquire(0.0)
    booked = bucket.try_acquire(0.0)
    assert bucket.try_acquire(1.0, ticket=booked.ticket).admitted
    again = bucket.try_acquire(1.0, ticket=booked.ticket)
    assert not again.admitted  # a used ticket is a newcomer: it competes
    assert again.ticket != booked.ticket
    assert again.retry_after_s == pytest.approx(1.0)


def test_an_unknown_ticket_is_treated_as_a_newcomer() -> None:
    bucket = TokenBucket(1.0, 1.0)
    assert bucket.try_acquire(0.0, ticket=12345).admitted
    assert not bucket.try_acquire(0.0, ticket=12345).admitted


def test_booked_callers_returning_late_together_do_not_exceed_the_burst() -> None:
    """A booking's capacity belongs to its slot: redeemed long after, it must not stack
    on top of a refilled bucket (here 900 late returns would all be admitted at once
    against a burst of 100)."""
    bucket = TokenBucket(100.0, 100.0)
    answers = herd(bucket, 1000)
    tickets = [a.ticket for a in answers if not a.admitted]
    late = 60.0  # every slot (the last at 9 s) is long past; the bucket is full again
    admitted = sum(bucket.try_acquire(late, ticket=t).admitted for t in tickets)
    admitted += sum(a.admitted for a in herd(bucket, 100, at=late))
    assert admitted <= bucket.burst


# -- validation ------------------------------------------------------------------------


def test_a_cost_above_the_burst_can_never_fit_and_is_refused() -> None:
    bucket = TokenBucket(10.0, 5.0)
    with pytest.raises(ValueError, match="never fit"):
        bucket.try_acquire(0.0, cost=5.5)
    assert bucket.try_acquire(0.0, cost=5.0).admitted


@pytest.mark.parametrize(
    "rate",
    [0.0, -1.0, math.inf, -math.inf, math.nan],
    ids=["zero", "negative", "inf", "minus-inf", "nan"],
)
def test_an_invalid_rate_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="rate_per_s"):
        TokenBucket(rate, 10.0)


@pytest.mark.parametrize(
    "burst",
    [0.0, 0.5, -1.0, math.inf, math.nan],
    ids=["zero", "below-one", "negative", "inf", "nan"],
)
def test_an_invalid_burst_is_refused(burst: float) -> None:
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(10.0, burst)


# -- the rate bound, for random traffic ------------------------------------------------


def assert_within_rate(admissions: list[tuple[float, float]], rate: float, burst: float) -> None:
    """Work admitted in any [t0, t1] is at most burst + rate * (t1 - t0)."""
    admissions.sort()
    for i, (t0, _) in enumerate(admissions):
        work = 0.0
        for t1, cost in admissions[i:]:
            work += cost
            assert work <= burst + rate * (t1 - t0) + 1e-6 * (1 + work), (t0, t1, work)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(min_value=0.5, max_value=100.0),
    burst=st.floats(min_value=1.0, max_value=20.0),
    book=st.booleans(),
    arrivals=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=10.0), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=120,
    ),
)
def test_admitted_work_never_exceeds_burst_plus_rate_times_the_interval(
    rate: float, burst: float, book: bool, arrivals: list[tuple[float, float]]
) -> None:
    bucket = TokenBucket(rate, burst, book=book)
    order = itertools.count()
    # (time, tie-break, cost as a fraction of the burst, ticket, attempts so far)
    queue: list[tuple[float, int, float, int | None, int]] = [
        (t, next(order), share, None, 0) for t, share in arrivals
    ]
    heapq.heapify(queue)
    admissions: list[tuple[float, float]] = []
    while queue:
        now, _, share, ticket, tries = heapq.heappop(queue)
        cost = max(share * burst, 1e-3)
        answer = bucket.try_acquire(now, cost, ticket=ticket)
        assert answer.retry_after_s >= 0.0
        if answer.admitted:
            admissions.append((now, cost))
        elif tries < 3:  # return on time; with booking, present the ticket
            # Booking, only a refusal past the horizon has none: it is told the horizon.
            assert (answer.ticket is not None) == (book and answer.retry_after_s < bucket.horizon_s)
            back = now + answer.retry_after_s
            heapq.heappush(queue, (back, next(order), share, answer.ticket, tries + 1))
        if book and ticket is not None:
            assert answer.admitted, "a booked caller returning on time was refused"
    assert_within_rate(admissions, rate, burst)


# -- quotas ----------------------------------------------------------------------------


def test_a_tenant_over_its_requests_per_minute_is_refused_with_the_exact_wait() -> None:
    quota = Quota(requests_per_min=2)
    assert quota.try_acquire(0.0).admitted
    assert quota.try_acquire(0.0).admitted
    refused = quota.try_acquire(0.0)
    assert not refused.admitted
    assert refused.retry_after_s == pytest.approx(30.0)
    assert refused.ticket is not None


def test_a_tenant_over_its_token_budget_is_refused_with_the_exact_wait() -> None:
    quota = Quota(requests_per_min=60, tokens_per_min=6000)  # 100 tokens a second
    assert quota.try_acquire(0.0, tokens=6000).admitted
    refused = quota.try_acquire(0.0, tokens=1000)
    assert not refused.admitted
    assert refused.retry_after_s == pytest.approx(10.0)
    assert refused.ticket is not None


def test_redeeming_a_quota_ticket_does_not_charge_twice() -> None:
    quota = Quota(requests_per_min=60, tokens_per_min=6000)
    assert quota.tokens is not None
    quota.try_acquire(0.0, tokens=6000)
    refused = quota.try_acquire(0.0, tokens=1000)
    tats = (quota.requests.tat, quota.tokens.tat)
    early = quota.try_acquire(4.0, ticket=refused.ticket)
    assert not early.admitted
    assert early.retry_after_s == pytest.approx(6.0)
    assert early.ticket == refused.ticket
    assert quota.try_acquire(10.0, ticket=refused.ticket).admitted
    assert (quota.requests.tat, quota.tokens.tat) == tats
    # the next request conforms exactly when the buckets say, not a second charge later
    expected = quota.tokens.conforms_at(10.0, 1000.0) - 10.0
    assert expected == pytest.approx(10.0)
    following = quota.try_acquire(10.0, tokens=1000)
    assert not following.admitted
    assert following.retry_after_s == pytest.approx(expected)


def test_a_quota_ticket_short_on_both_budgets_waits_for_the_later() -> None:
    quota = Quota(requests_per_min=1, tokens_per_min=600)  # 1 request, 10 tokens a second
    assert quota.try_acquire(0.0, tokens=600).admitted
    refused = quota.try_acquire(0.0, tokens=300)
    assert refused.retry_after_s == pytest.approx(60.0)  # requests: 60 s; tokens: 30 s
    halfway = quota.try_acquire(30.0, ticket=refused.ticket)  # the tokens part is now paid
    assert not halfway.admitted
    assert halfway.retry_after_s == pytest.approx(30.0)
    assert quota.try_acquire(60.0, ticket=refused.ticket).admitted


def test_a_used_quota_ticket_is_not_a_free_pass() -> None:
    quota = Quota(requests_per_min=1)
    quota.try_acquire(0.0)
    refused = quota.try_acquire(0.0)
    assert quota.try_acquire(60.0, ticket=refused.ticket).admitted
    assert not quota.try_acquire(60.0, ticket=refused.ticket).admitted


def test_a_quota_without_a_token_budget_counts_requests_only() -> None:
    quota = Quota(requests_per_min=3)
    assert quota.tokens is None
    assert all(quota.try_acquire(0.0, tokens=10**9).admitted for _ in range(3))
    assert not quota.try_acquire(0.0).admitted


def test_two_tenants_are_independent() -> None:
    a = Quota(requests_per_min=60, tokens_per_min=1000)
    b = Quota(requests_per_min=60, tokens_per_min=1000)
    assert a.try_acquire(0.0, tokens=1000).admitted
    assert not a.try_acquire(0.0, tokens=1).admitted
    assert all(b.try_acquire(0.0, tokens=10).admitted for _ in range(60))
    assert not b.try_acquire(0.0).admitted
    refused_a = a.try_acquire(0.0, tokens=100)
    assert refused_a.retry_after_s == pytest.approx(6.0 + 0.06)  # its own backlog only


# -- the horizon: bookings are bounded ---------------------------------------------------


def test_a_herd_of_refusals_at_one_instant_books_no_further_than_the_horizon() -> None:
    """20,000 callers at once against 1 a second: only the horizon's worth is booked (it
    was 19,999 tickets, the last told to wait 19,799 s); the rest are refused, told to
    come back when every booking made so far has come due, and push nothing later."""
    bucket = TokenBucket(1.0, 200.0)
    answers = herd(bucket, 20_000)
    refused = [a for a in answers if not a.admitted]
    booked = [a for a in refused if a.ticket is not None]
    assert len(booked) <= bucket.horizon_s * bucket.rate + 1
    assert max(a.retry_after_s for a in refused) <= bucket.horizon_s + 1e-9
    assert bucket.bookings == len(booked)
    tat = bucket.tat
    assert not bucket.try_acquire(0.0).admitted
    assert bucket.tat == tat  # a refusal past the horizon takes nothing from the future
    unbooked = refused[-1]
    assert unbooked.ticket is None
    assert unbooked.retry_after_s == pytest.approx(bucket.horizon_s)
    # The last booked caller, back on its ticket at its slot, is admitted as ever.
    last = booked[-1]
    assert bucket.try_acquire(last.retry_after_s, ticket=last.ticket).admitted
    # An unbooked one, back when it was told, books a slot of its own.
    back = bucket.try_acquire(unbooked.retry_after_s)
    assert back.ticket is not None
    assert back.retry_after_s <= bucket.horizon_s


def test_the_horizon_is_the_longest_wait_a_caller_is_told() -> None:
    bucket = TokenBucket(10.0, 10.0, horizon_s=2.0)
    answers = herd(bucket, 100)
    assert sum(a.admitted for a in answers) == 10
    assert sum(a.ticket is not None for a in answers) == 20  # slots 0.1 s .. 2.0 s
    assert max(a.retry_after_s for a in answers) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="horizon_s"):
        TokenBucket(1.0, 1.0, horizon_s=0.0)


def test_bookings_nobody_came_back_for_are_forgotten_once_their_slot_and_ttl_pass() -> None:
    bucket = TokenBucket(1.0, 1.0, ticket_ttl_s=30.0)
    answers = herd(bucket, 301)
    assert bucket.bookings == 300  # slots at 1 s .. 300 s, the horizon
    assert bucket.try_acquire(100.0, ticket=answers[100].ticket).admitted
    assert bucket.bookings == 299 - 69  # the 69 slots before 70 s are past their ttl
    assert bucket.try_acquire(330.0 + 1e-6).admitted  # every slot came due, then its ttl
    assert bucket.bookings == 0


def test_a_quota_books_no_further_than_the_horizon_and_forgets_with_its_buckets() -> None:
    quota = Quota(requests_per_min=60, tokens_per_min=6000)
    answers = [quota.try_acquire(0.0, tokens=10) for _ in range(20_000)]
    refused = [a for a in answers if not a.admitted]
    booked = [a for a in refused if a.ticket is not None]
    horizon = quota.requests.horizon_s
    assert len(booked) <= horizon * quota.requests.rate + 1
    assert max(a.retry_after_s for a in refused) <= horizon + 1e-9
    assert quota.bookings == len(booked)
    assert quota.try_acquire(booked[0].retry_after_s, ticket=booked[0].ticket).admitted
    assert quota.bookings == len(booked) - 1
    later = horizon + quota.requests.ticket_ttl_s + 1.0  # every slot and its ttl passed
    assert quota.try_acquire(later).admitted
    assert quota.bookings == 0
    assert quota.requests.bookings == 0


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(min_value=0.5, max_value=50.0),
    burst=st.floats(min_value=1.0, max_value=10.0),
    horizon=st.floats(min_value=0.5, max_value=20.0),
    ttl=st.floats(min_value=1.0, max_value=20.0),
    arrivals=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=30.0), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=300,
    ),
)
def test_bookings_and_waits_stay_within_the_horizon(
    rate: float, burst: float, horizon: float, ttl: float, arrivals: list[tuple[float, float]]
) -> None:
    """Whatever arrives, in time order: no wait told is longer than the horizon, no
    more bookings are held than slots fit between ``now - ttl`` and ``now + horizon``
    (each at least ``1 / rate`` after the last, every cost being at least 1), a caller
    back on its ticket at its slot is admitted, and admitted work keeps to the rate."""
    bucket = TokenBucket(rate, burst, horizon_s=horizon, ticket_ttl_s=ttl)
    order = itertools.count()
    queue: list[tuple[float, int, float, int | None, int]] = [
        (t, next(order), share, None, 0) for t, share in arrivals
    ]
    heapq.heapify(queue)
    admissions: list[tuple[float, float]] = []
    while queue:
        now, _, share, ticket, tries = heapq.heappop(queue)
        cost = 1.0 + share * (burst - 1.0)
        answer = bucket.try_acquire(now, cost, ticket=ticket)
        assert 0.0 <= answer.retry_after_s <= horizon + 1e-9
        assert bucket.bookings <= rate * (horizon + ttl) + 1 + 1e-9
        if ticket is not None:
            assert answer.admitted, "a booked caller returning on time was refused"
        if answer.admitted:
            admissions.append((now, cost))
        elif tries < 3:
            back = now + answer.retry_after_s
            heapq.heappush(queue, (back, next(order), share, answer.ticket, tries + 1))
    assert_within_rate(admissions, rate, burst)


def test_a_quota_ticket_back_too_late_is_booked_afresh_and_admitted_on_that_booking() -> None:
    """Past its grace the slot is gone and the request books again like a newcomer; the
    quota ticket then claims that booking (it used to keep the stale one, so every
    return booked yet another slot and was never admitted)."""
    quota = Quota(requests_per_min=60, burst=1)  # one a second, a second's grace
    assert quota.try_acquire(0.0).admitted
    late = quota.try_acquire(0.0)
    assert late.retry_after_s == pytest.approx(1.0)
    others = [quota.try_acquire(5.0) for _ in range(4)]  # one admitted, slots 6 s .. 8 s
    assert [a.ticket is not None for a in others] == [False, True, True, True]
    again = quota.try_acquire(5.0, ticket=late.ticket)  # four seconds past its slot
    assert not again.admitted
    assert again.ticket == late.ticket
    assert again.retry_after_s == pytest.approx(4.0)  # after the three booked meanwhile
    tat = quota.requests.tat
    assert quota.try_acquire(9.0, ticket=late.ticket).admitted
    assert quota.requests.tat == tat  # on the booking it was given, not a new one
    assert quota.bookings == 3
