"""A stage lost with the router's own link is not a node's fault: the rule alone, the
rescue decision with it, and the request lifecycle of a router cut off mid-request
(server-partition), beside a node frozen in a swarm the router still hears."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from hecate.core import Recovered, Unrecoverable
from hecate.wire.messages import Failover
from hecate_router.flow import (
    Answer,
    Failure,
    FailureKind,
    FlowOptions,
    Report,
    Send,
    StageFailed,
    StageReplied,
    Tick,
)
from hecate_router.hearing import Hearing, isolated
from hecate_router.lifecycle import Lifecycle
from hecate_router.reconnect import ReconnectWindow
from hecate_router.rescue import GiveUp, ResendSoon, triage, verdict
from hecate_router.states import State
from tests.services.router.test_lifecycle import Run, Swarm, answer, started
from tests.services.router.test_rescue import RESCUED

OPTS = FlowOptions()  # 2 s stage timeout, deaf after 1 s, excused for 4 s
KINDS: tuple[FailureKind, ...] = get_args(FailureKind)
TIMEOUT = Failure("timeout", "no reply within 2.0 s")


# -- the rule -----------------------------------------------------------------------------


@given(
    kind=st.sampled_from(KINDS),
    heard=st.none() | st.floats(0, 10),
    back=st.floats(0, 10),
    sent=st.floats(0, 10),
    later=st.floats(0, 10),
)
def test_only_a_timeout_or_a_failed_publish_can_be_the_router_s_own(
    kind: FailureKind, heard: float | None, back: float, sent: float, later: float
) -> None:
    hearing = Hearing(heard)
    now = sent + later
    why = isolated(
        Failure(kind, "why"), hearing, reconnected_at=back, sent=sent, now=now, quiet_s=1.0
    )
    if kind == "publish_failed":
        assert why is not None
    elif kind != "timeout":
        assert why is None  # an answer, a status or a verdict came in over the link
    else:
        deaf = heard is not None and now - heard >= 1.0
        assert (why is not None) == (back > sent or deaf)


@given(times=st.lists(st.floats(0, 100), max_size=20))
def test_hearing_keeps_the_latest_and_an_unfed_one_is_never_deaf(times: list[float]) -> None:
    hearing = Hearing()
    assert not hearing.deaf(1e9, 1.0)
    for t in times:
        hearing.heard(t)
    assert hearing.last == (max(times) if times else None)


# -- the rescue decision -------------------------------------------------------------------


@given(first=st.none() | st.floats(0, 10), now=st.floats(10, 20))
def test_an_isolated_failure_is_resent_until_the_limit_then_rescued_as_any(
    first: float | None, now: float
) -> None:
    got = triage(
        TIMEOUT,
        now,
        node_id="b",
        window=ReconnectWindow(),
        stage=0,
        opts=OPTS,
        isolated="deaf",
        excused_since=first,
    )
    if first is None or now - first < OPTS.isolation_limit_s:
        assert got == ResendSoon(now + OPTS.resend_delay_s, "deaf")
    else:
        assert got is None


def test_a_request_too_large_is_still_its_own_fault_when_the_router_is_cut_off() -> None:
    why = Failure("too_large", "big")
    got = triage(why, 1.0, node_id="b", window=ReconnectWindow(), stage=0, opts=OPTS, isolated="x")
    assert got == GiveUp("payload_too_large", "big")


@given(
    rescued=st.booleans(),
    attempts=st.integers(1, 5),
    replays=st.none() | st.integers(0, 3),
    cut_off=st.booleans(),
)
def test_a_router_cut_off_never_answers_that_a_node_was_lost(
    rescued: bool, attempts: int, replays: int | None, cut_off: bool
) -> None:
    result = RESCUED if rescued else Unrecoverable("no replica for b")
    got = verdict(
        result,
        TIMEOUT,
        "b",
        attempts=attempts,
        replays=replays,
        opts=OPTS,
        isolated="deaf" if cut_off else None,
    )
    if isinstance(got, Recovered):
        return
    assert got.code == ("timeout" if cut_off else "unrecoverable")
    if cut_off:
        assert "cut off" in got.message
        assert "deaf" in got.message


# -- one request's life --------------------------------------------------------------------


def deaf_run(**kw: object) -> tuple[Run, Hearing]:
    """A request started at 0 by a router that heard its last at 0."""
    run = started(Swarm(), **kw)
    hearing = Hearing(0.0)
    run.m.hearing = hearing
    return run, hearing


def blamed(run: Run) -> list[object]:
    return [a for a in run.actions if isinstance(a, Failover | Report)]


def test_a_router_cut_off_mid_request_resends_blames_nobody_and_answers_once_back() -> None:
    run, hearing = deaf_run()
    first = run.last
    assert run.feed(Tick(2.1)) == []  # past the deadline, deaf for 2.1 s: its own link
    assert run.m.state is State.RESENDING
    assert blamed(run) == []
    again = run.feed(Tick(2.2))[-1]
    assert isinstance(again, Send)
    assert again.node_id == first.node_id
    # Its link is reset and it reconnects at 3.3 (the resend went into the held link):
    # at the resend's deadline it is sent once more, nobody blamed.
    run.m.reconnect.reconnected(3.3, expected=())
    hearing.heard(3.4)
    assert run.feed(Tick(4.3)) == []
    assert run.m.state is State.RESENDING
    assert blamed(run) == []
    run.now = 4.5
    run.feed(Tick(4.5))
    run.finish()
    (ans,) = [a for a in run.actions if isinstance(a, Answer)]
    assert ans.reply.ok
    assert ans.reply.attempts == 1
    assert blamed(run) == [a for a in run.actions if isinstance(a, Report) and a.ok]
    assert run.m.counters["resent_isolated"] == 2
    assert run.m.counters["failovers"] == 0


def test_a_frozen_node_in_a_swarm_the_router_hears_is_failed_over_at_its_deadline() -> None:
    run, hearing = deaf_run()
    lost = run.last.node_id
    hearing.heard(1.9)  # other flights' replies, telemetry's snapshots
    out = run.feed(Tick(2.1))
    (failover,) = [a for a in out if isinstance(a, Failover)]
    assert failover.lost_node == lost
    assert run.m.attempts == 2
    assert isinstance(out[-1], Send)
    assert out[-1].node_id != lost


def test_a_stage_that_never_left_the_router_is_sent_again_not_failed_over() -> None:
    run, _ = deaf_run()
    send = run.last
    failure = Failure("publish_failed", "publish failed: ConnectionClosedError()")
    assert run.feed(StageFailed(send.send, send.stage, failure, 0.01)) == []
    assert run.m.state is State.RESENDING
    assert blamed(run) == []


@given(ticks=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=40))
def test_a_router_that_stays_deaf_answers_timeout_bounded_and_never_unrecoverable(
    ticks: list[float],
) -> None:
    """Whatever the sweep's rhythm: nothing heard after 0, no node answering. The
    request is excused for the limit only (then failed over as before, a frozen node in
    a silent swarm is still routed round), and its answer, if any, says the router is
    cut off."""
    run, _ = deaf_run()
    now = 0.0
    for dt in ticks:
        now += dt
        if any(isinstance(a, Failover) for a in run.feed(Tick(now))):
            # The excuse ran out: only after the limit from the first excused timeout.
            assert run.m.excused_since is not None
            assert now - run.m.excused_since >= OPTS.isolation_limit_s
    m: Lifecycle = run.m
    assert m.attempts <= m.options.max_attempts
    for a in run.actions:
        if isinstance(a, Answer):
            assert a.reply.error is not None
            assert a.reply.error.code == "timeout"
    # Long enough deaf, it has answered: the excuse plus three stage timeouts, with the
    # sweep's rhythm and resend delays.
    if now > OPTS.stage_timeout_s + OPTS.isolation_limit_s + 4 * (OPTS.stage_timeout_s + 3.2):
        assert m.state is State.DONE


@given(
    heard_gap=st.floats(0, 0.99),
    replies=st.integers(0, 2),
)
def test_a_router_that_keeps_hearing_fails_a_silent_node_over_at_every_deadline(
    heard_gap: float, replies: int
) -> None:
    """node-freeze and node-blackhole: the router hears the swarm (within deaf_after_s
    of every deadline), so each stage timeout blames the node as before."""
    run, hearing = deaf_run()
    for _ in range(replies):  # some stages answered before the freeze
        if run.m.stage < len(run.m.route.stages) - 1:
            s = run.last
            run.now = run.m.sent_at + 0.01
            run.feed(StageReplied(s.send, s.stage, answer(s), run.now))
    deadline = run.m.deadline
    hearing.heard(deadline + 0.01 - heard_gap)
    out = run.feed(Tick(deadline + 0.01))
    assert sum(isinstance(a, Failover) for a in out) == 1
    assert run.m.counters["resent_isolated"] == 0
