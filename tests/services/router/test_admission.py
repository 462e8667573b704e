"""Admission control: the adaptive per-pipeline limit, the fair line, the Retry-After."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate_router.admission import MAX_TICKETS, AdmissionDesk
from hecate_router.limits import (
    AdaptiveLimit,
    FairQueue,
    Finishing,
    LimitOptions,
    line_wait_s,
    retry_after_s,
)


def drive(limit: AdaptiveLimit, *, base_s: float, knee: int, steps: int = 400) -> None:
    """A pipeline that serves ``knee`` requests at once in ``base_s`` a step and queues
    the rest (throughput ``knee / base_s`` at most), always offered more than its limit."""
    now = 0.0
    for _ in range(steps):
        carried = limit.capacity
        rtt = base_s * max(1.0, carried / knee)
        now += rtt
        limit.sample(rtt, carried, now)


@pytest.mark.parametrize("knee", [1, 4, 8, 16])
def test_the_limit_settles_where_steps_lose_their_pace(knee: int) -> None:
    """The pipeline holds ``knee`` requests at its best step time; past that each step
    takes longer in proportion. Steps keep a good pace up to 3·knee, and the limit is
    twice the most carried at that pace."""
    limit = AdaptiveLimit(LimitOptions(initial=1, slack_s=0.0, ceiling=256))
    drive(limit, base_s=0.07, knee=knee)
    assert 2 * knee <= limit.capacity <= 6 * knee


def test_a_pipeline_with_room_doubles_its_limit_step_after_step() -> None:
    limit = AdaptiveLimit(LimitOptions(initial=1, slack_s=0.0, ceiling=256))
    seen = []
    now = 0.0
    for _ in range(5):  # never full: every step takes the best time
        now += 0.07
        limit.sample(0.07, limit.capacity, now)
        seen.append(limit.capacity)
    assert seen == [2, 4, 8, 16, 32]


def test_a_toy_stage_is_not_throttled_by_scheduling_noise() -> None:
    """Sub-millisecond steps: the slack, not the step time, decides the fill."""
    limit = AdaptiveLimit(LimitOptions(slack_s=0.05, ceiling=64))
    now = 0.0
    for i in range(500):
        rtt = 0.0004 if i % 2 else 0.003  # jitter of several times the best step
        now += rtt
        limit.sample(rtt, limit.capacity, now)
    assert limit.capacity == 64


def test_a_slowdown_past_the_pace_does_not_raise_the_limit() -> None:
    options = LimitOptions(initial=8, ceiling=64, slack_s=0.0, held_window_s=10.0)
    limit = AdaptiveLimit(options)
    drive(limit, base_s=0.1, knee=8, steps=100)
    high = limit.capacity
    now = 100.0
    for _ in range(30):  # every step now past the pace: nothing more is carried well
        now += 1.0
        limit.sample(0.4 * max(1.0, limit.capacity / 8), limit.capacity, now)
    assert limit.capacity <= high
    assert limit.held is not None


@given(
    st.lists(
        st.tuples(st.floats(1e-4, 10.0), st.integers(0, 100)),
        min_size=1,
        max_size=200,
    )
)
def test_the_limit_stays_within_its_bounds(samples: list[tuple[float, int]]) -> None:
    options = LimitOptions(floor=2, initial=4, ceiling=32)
    limit = AdaptiveLimit(options)
    now = 0.0
    for rtt, carried in samples:
        now += rtt
        limit.sample(rtt, carried, now)
        assert options.floor <= limit.limit <= options.ceiling


@given(st.floats(1e-3, 1.0), st.integers(1, 64), st.floats(1.0, 10.0))
def test_never_more_than_gain_times_what_was_seen_carried(
    base: float, carried: int, slower: float
) -> None:
    """The limit can only grow from work the pipeline was seen to carry."""
    limit = AdaptiveLimit(LimitOptions(initial=1, ceiling=10_000, slack_s=0.0))
    limit.sample(base, 1, 0.0)
    limit.sample(base * slower, carried, 1.0)
    assert limit.limit <= 2 * max(1, carried) + 1e-9


@given(st.floats(1e-3, 1.0), st.integers(2, 64))
def test_steps_past_the_pace_never_raise_the_limit(base: float, carried: int) -> None:
    limit = AdaptiveLimit(LimitOptions(initial=1, ceiling=10_000, slack_s=0.0))
    limit.sample(base, 1, 0.0)
    before = limit.limit
    limit.sample(base * 3.5, carried, 1.0)
    assert limit.limit == before


def run_at(
    limit: AdaptiveLimit, *, base_s: float, knee: int, now: float, for_s: float
) -> tuple[float, list[int]]:
    """Like :func:`drive`, for ``for_s`` seconds from ``now``: the time it ends at, and
    the capacity after each step."""
    seen: list[int] = []
    end = now + for_s
    while now < end:
        carried = limit.capacity
        rtt = base_s * max(1.0, carried / knee)
        now += rtt
        limit.sample(rtt, carried, now)
        seen.append(limit.capacity)
    return now, seen


def test_a_pipeline_slowed_for_good_sees_its_limit_fall_then_follow_the_new_pace() -> None:
    """Someone else's work on its cores: every step now takes ten times as long. Past the
    pace for good, the limit comes down (to the floor, where near-idle steps re-learn
    the best step time) within a bounded number of windows, then settles at what the
    pipeline carries at its new pace. Before, it stayed at 64 for as long as it ran."""
    options = LimitOptions()  # held over 10 s windows, the best step over 60 s ones
    limit = AdaptiveLimit(options)
    now, _ = run_at(limit, base_s=0.1, knee=32, now=0.0, for_s=400.0)
    assert limit.capacity == 64
    fell_by = now + 30 * options.held_window_s
    now, seen = run_at(limit, base_s=1.0, knee=32, now=now, for_s=30 * options.held_window_s)
    assert min(seen) == options.floor, f"still {min(seen)} before {fell_by:.0f} s"
    now, seen = run_at(limit, base_s=1.0, knee=32, now=now, for_s=600.0)
    assert limit.min_rtt_s == pytest.approx(1.0)  # the best step, at the new pace
    assert limit.capacity == 64  # steps at 64 (2 s) keep the new pace (3 s)


def test_a_pipeline_that_now_serves_fewer_settles_at_its_new_pace() -> None:
    """Slower steps, and fewer served at once before they slow down further: the limit
    ends where the steps lose the new pace, as for a pipeline that was always so."""
    limit = AdaptiveLimit(LimitOptions(slack_s=0.0))
    now, _ = run_at(limit, base_s=0.1, knee=32, now=0.0, for_s=400.0)
    assert limit.capacity == 64
    now, seen = run_at(limit, base_s=1.0, knee=4, now=now, for_s=1800.0)
    assert min(seen) < 8
    assert 2 * 4 <= limit.capacity <= 6 * 4


@settings(deadline=None)
@given(
    base=st.floats(1e-3, 0.5),
    knee=st.integers(1, 64),
    slower=st.floats(8.0, 100.0),
    idle_s=st.floats(0.0, 1e6),
)
def test_only_slow_steps_bring_the_limit_down_and_idleness_never_does(
    base: float, knee: int, slower: float, idle_s: float
) -> None:
    """A pipeline whose every step is now past ``gain · tolerance`` times its best,
    whatever it carries, sees its limit fall within three windows of such steps (it may
    climb back once near-idle steps have re-learned the best time at the new pace);
    time with no steps at all, however long, takes nothing from it."""
    options = LimitOptions(initial=1, slack_s=0.0, ceiling=64)
    limit = AdaptiveLimit(options)
    now, _ = run_at(limit, base_s=base, knee=knee, now=0.0, for_s=1000 * base)
    before = limit.capacity
    assert before >= 2 * min(knee, 32)
    now += idle_s  # nothing at all: no step to learn from
    rtt = base * max(1.0, before / knee)
    limit.sample(rtt, before, now + rtt)
    assert limit.capacity == before
    now += rtt
    end = now + 3 * options.held_window_s
    seen: list[int] = []
    while now < end or len(seen) < 3:
        carried = limit.capacity
        rtt = slower * base * max(1.0, carried / knee)
        now += rtt
        limit.sample(rtt, carried, now)
        seen.append(limit.capacity)
        assert options.floor <= limit.limit <= options.ceiling
    assert min(seen) < before


def test_invalid_samples_are_ignored() -> None:
    limit = AdaptiveLimit()
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        limit.sample(bad, 4, 0.0)
    assert limit.min_rtt_s is None
    assert limit.limit == limit.options.initial


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="floor <= initial"):
        LimitOptions(floor=4, initial=2)
    with pytest.raises(ValueError, match="gain >= 1"):
        LimitOptions(gain=0.5)


def test_the_best_step_is_relearned_within_two_windows() -> None:
    limit = AdaptiveLimit(LimitOptions(rtt_window_s=10.0))
    limit.sample(0.01, 1, 0.0)
    for t in range(1, 25):
        limit.sample(0.05, 1, float(t))  # the swarm got slower for good
    assert limit.min_rtt_s == 0.05


def test_steps_under_load_do_not_raise_the_best_time() -> None:
    limit = AdaptiveLimit(LimitOptions(rtt_window_s=10.0, ceiling=64))
    limit.sample(0.01, 1, 0.0)
    for t in range(1, 60):
        limit.sample(0.5, 32, float(t))  # slow because loaded: not a slower swarm
    assert limit.min_rtt_s == 0.01


# -- the line ------------------------------------------------------------------------


def test_one_request_of_a_quiet_tenant_is_not_stuck_behind_a_burst() -> None:
    q: FairQueue[str] = FairQueue(limit=100)
    for i in range(20):
        assert q.push("loud", f"loud-{i}", 0.0)
    assert q.push("quiet", "quiet-0", 1.0)
    served = [q.pop() for _ in range(3)]
    assert "quiet-0" in served[:2]


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers()), max_size=60))
def test_the_line_is_fifo_per_tenant_and_round_robin(pushes: list[tuple[str, int]]) -> None:
    q: FairQueue[tuple[str, int]] = FairQueue(limit=1000)
    for n, (tenant, value) in enumerate(pushes):
        assert q.push(tenant, (tenant, n), float(value))
    assert len(q) == len(pushes)
    out = []
    while (item := q.pop()) is not None:
        out.append(item)
    assert sorted(out) == sorted((t, n) for n, (t, _) in enumerate(pushes))
    for tenant in "abcd":
        mine = [n for t, n in out if t == tenant]
        assert mine == sorted(mine)  # first in, first out within a tenant
    # Round robin: while k tenants still wait, no tenant is served twice in k pops.
    waiting = {t: sum(1 for p, _ in pushes if p == t) for t in "abcd"}
    for i, (tenant, _n) in enumerate(out):
        active = [t for t, c in waiting.items() if c > 0]
        window = out[i + 1 : i + len(active)]
        assert tenant not in [t for t, _ in window] or (waiting[tenant] > 1 and len(active) == 1)
        waiting[tenant] -= 1


def test_the_line_is_bounded_in_total_and_per_tenant() -> None:
    q: FairQueue[int] = FairQueue(limit=4, tenant_limit=3)
    assert all(q.push("a", i, 0.0) for i in range(3))
    assert not q.push("a", 3, 0.0)  # a's share is full
    assert q.push("b", 4, 0.0)
    assert not q.push("c", 5, 0.0)  # the line is full
    assert len(q) == 4
    assert q.waiting("a") == 3


def test_waiting_too_long_takes_a_request_out_of_line() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a", "old", 0.0, until=3.0)
    q.push("a", "new", 4.0, until=7.0)
    q.push("b", "b-old", 1.0, until=4.0)
    assert sorted(q.expire(6.0)) == [("b-old", 1.0), ("old", 0.0)]
    assert list(q) == ["new"]
    assert len(q) == 1


def test_a_caller_back_with_its_place_goes_before_those_who_came_after_it() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a", "second", 2.0)
    q.push("a", "third", 3.0)
    q.push("a", "first-again", 4.0, since=1.0)  # refused at 1.0's place, back as told
    q.push("a", "fourth", 5.0)
    assert [q.pop() for _ in range(4)] == ["first-again", "second", "third", "fourth"]


def test_the_finishing_rate_is_what_is_carried_over_how_long_one_takes() -> None:
    rate = Finishing()
    assert rate.per_s() == 0.0  # nothing measured yet
    for _ in range(8):
        rate.began()
    rate.finished(4.0)  # one took 4 s; seven still carried
    assert rate.per_s() == 7 / 4.0
    # However long nothing finishes, the rate does not collapse while work is carried:
    # long generations all running are not a line that never moves.
    assert rate.per_s() == 7 / 4.0


def test_retry_after_follows_the_line_and_the_rate() -> None:
    assert retry_after_s(0, 0.0) == 1.0  # nothing measured yet: the floor
    assert retry_after_s(9, 2.0) == 5.0  # ten to serve at two a second
    assert retry_after_s(0, 100.0) == 1.0


def test_the_line_allows_what_the_line_ahead_needs_within_its_bounds() -> None:
    assert line_wait_s(3, 0.0, least_s=5.0, most_s=60.0) == 5.0  # nothing measured
    assert line_wait_s(11, 1.0, least_s=5.0, most_s=60.0) == 18.0  # 12 at 1/s, x1.5
    assert line_wait_s(0, 10.0, least_s=5.0, most_s=60.0) == 5.0
    assert line_wait_s(500, 1.0, least_s=5.0, most_s=60.0) == 60.0


@given(
    ahead=st.integers(0, 1000),
    carried=st.integers(1, 64),
    took=st.floats(0.01, 600.0),
)
def test_a_refused_caller_is_told_what_the_line_ahead_needs(
    ahead: int, carried: int, took: float
) -> None:
    """Never minutes for a line of seconds: the wait told is the line ahead at the rate
    the carried requests finish, whenever the last one finished."""
    rate = Finishing()
    for _ in range(carried + 1):
        rate.began()
    rate.finished(took)
    told = retry_after_s(ahead, rate.per_s())
    needed = (ahead + 1) * took / carried
    assert told == max(1.0, needed) or abs(told - max(1.0, needed)) < 1e-6 * needed


# -- the router's desk ---------------------------------------------------------------


def test_the_desk_counts_pipelines_full_at_their_limit() -> None:
    desk: AdmissionDesk[str] = AdmissionDesk(limits=LimitOptions(initial=2, floor=1))
    desk.began("p1", "m")
    assert desk.full() == set()
    desk.began("p1", "m")
    assert desk.full() == {"p1"}
    desk.moved("p1", "p2")  # failed over: the load moves with it
    assert desk.in_flight["p1"] == 1
    assert desk.in_flight["p2"] == 1
    desk.ended("p2", "m", 1.0)
    desk.ended("p2", "m", 1.0)  # never below zero
    assert desk.in_flight["p2"] == 0
    assert desk.full() == set()


def test_the_desk_lines_up_per_model_and_expires() -> None:
    desk: AdmissionDesk[str] = AdmissionDesk(queue_limit=2, max_wait_s=1.0)
    assert desk.wait("m", "t", "r1", 0.0)
    assert desk.wait("m", "u", "r2", 0.5)
    assert not desk.wait("m", "v", "r3", 0.5)  # the line is full
    assert desk.waiting("m") == 2
    assert desk.models_waiting() == ["m"]
    assert list(desk.expired(1.2)) == [("m", "r1", 0.0)]
    assert desk.next("m") == "r2"
    assert desk.next("m") is None
    assert desk.retry_after_s("m") >= 1.0
    assert desk.status()["waiting"] == {}


def test_the_line_waits_as_long_as_the_requests_ahead_take_to_finish() -> None:
    """Eight generations of 6 s each carried, 16 more in line: the last in line is
    served in about 12 s, and is not refused at a fixed 5 s; the first, due in under
    a second, is refused at 5 s if the line has not moved by then."""
    desk: AdmissionDesk[str] = AdmissionDesk(max_wait_s=5.0, max_line_wait_s=60.0)
    for _ in range(9):
        desk.began("p1", "m")
    desk.ended("p1", "m", 6.0)  # one landed after 6 s, eight carried
    for i in range(16):
        assert desk.wait("m", f"user-{i}", f"r{i}", 0.0)
    assert [r for _, r, _ in desk.expired(5.01)] == ["r0", "r1", "r2", "r3"]
    assert "r15" not in [r for _, r, _ in desk.expired(17.9)]  # 1.5 x 16 x 0.75 s
    assert [r for _, r, _ in desk.expired(18.01)] == ["r15"]
    assert desk.retry_after_s("m") == 1.0  # the line is empty again: the floor
    assert desk.wait("m", "late", "r16", 18.0)
    assert desk.retry_after_s("m") == 1.5  # behind one


def test_a_refused_caller_back_with_its_ticket_keeps_its_place() -> None:
    desk: AdmissionDesk[str] = AdmissionDesk(max_wait_s=1.0)
    assert desk.wait("m", "t", "first", 0.0)
    [(_, item, since)] = desk.expired(1.5)
    ticket = desk.ticket("m", "t", since, retry_after_s=2.0, now=1.5)
    assert ticket < 0  # never one of the quota desk's
    assert desk.wait("m", "t", "second", 2.0)
    assert desk.wait("m", "t", item, 3.0, ticket=ticket)  # back as told
    assert desk.next("m") == "first"
    assert desk.next("m") == "second"
    # A ticket is spent once, holds only its tenant's and model's place, and lapses.
    assert desk.place(ticket, "m", "t", 3.0) is None
    other = desk.ticket("m", "t", 0.0, retry_after_s=2.0, now=3.0)
    assert desk.place(other, "m", "u", 3.0) is None
    assert desk.place(other, "n", "t", 3.0) is None
    late = desk.ticket("m", "t", 0.0, retry_after_s=2.0, now=3.0)
    assert desk.place(late, "m", "t", 3.0 + 2.0 + 5.1) is None


def test_line_tickets_are_bounded() -> None:
    desk: AdmissionDesk[str] = AdmissionDesk()
    for i in range(MAX_TICKETS + 100):
        desk.ticket("m", "t", 0.0, retry_after_s=1.0, now=float(i) * 1e-6)
    assert len(desk._tickets) == MAX_TICKETS


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["began", "ended", "moved", "sample"]),
            st.sampled_from(["p1", "p2", "p3"]),
            st.sampled_from(["p1", "p2", "p3"]),
            st.floats(1e-3, 1.0),
        ),
        max_size=80,
    )
)
def test_the_full_set_kept_up_to_date_is_the_one_worked_out(
    ops: list[tuple[str, str, str, float]],
) -> None:
    desk: AdmissionDesk[str] = AdmissionDesk(limits=LimitOptions(initial=2, slack_s=0.0))
    now = 0.0
    for op, p, q, rtt in ops:
        now += rtt
        if op == "began":
            desk.began(p, "m")
        elif op == "ended":
            desk.ended(p, "m", rtt)
        elif op == "moved":
            desk.moved(p, q)
        else:
            desk.sample(p, rtt, now)
        worked_out = {x for x, n in desk.in_flight.items() if n >= desk.limit(x).capacity}
        assert set(desk.full()) == worked_out
