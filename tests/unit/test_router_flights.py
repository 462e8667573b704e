"""The router's one rule for acting on a flight (flights.py) and its backlog of breaker
reports (breakers.py), driven directly: no bus, no clock but the one passed in.

The orders below are the ones the router meets on the bus: a stage's reply and the
node-down event (or the sweep's timeout) for the same send arrive by different paths,
and the sweep and the node-down handler decide on a list taken before they await."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace import INVALID_SPAN

from hecate.core import Route, Stage
from hecate.services.backlog import Backlog, Held
from hecate.services.flights import Flight, claim, expired, land, live, waiting_on
from hecate.wire.messages import InferRequest, OutcomeReport

ROUTE = Route(
    model_id="m",
    pipeline_id="m-r0",
    cost=1.0,
    stages=(
        Stage(node_id="a", layer_start=0, layer_end=2),
        Stage(node_id="b", layer_start=2, layer_end=4),
    ),
)


def flight_in(table: dict[int, Flight], key: int = 1, deadline: float = 10.0) -> Flight:
    f = Flight(
        key=key,
        request_id=f"r{key}",
        model_id="m",
        reply_to="caller",
        request=InferRequest(prompt="p"),
        route=ROUTE,
        span=INVALID_SPAN,
        started=0.0,
    )
    table[key] = f
    f.next_send()
    f.deadline = deadline
    return f


def test_each_send_has_a_token_never_used_before() -> None:
    table: dict[int, Flight] = {}
    f = flight_in(table)
    tokens = {f.dispatch}
    for _ in range(5):
        tokens.add(f.next_send())
    assert len(tokens) == 6


def test_a_reply_that_landed_first_leaves_the_node_down_list_nothing_to_do() -> None:
    """The order that answered twice: node-down takes its list, the reply lands and the
    flight is answered, then node-down reaches the flight."""
    table: dict[int, Flight] = {}
    f = flight_in(table)
    decided = waiting_on(table, "a", chained=False)
    assert decided == [(f, f.dispatch)]

    assert claim(table, f, f.dispatch)  # the reply
    assert land(table, f)  # ... answered

    assert [claim(table, g, send) for g, send in decided] == [False]
    assert not land(table, f), "answered twice"


def test_a_reply_that_landed_first_leaves_the_sweep_nothing_to_do() -> None:
    table: dict[int, Flight] = {}
    f = flight_in(table, deadline=1.0)
    decided = expired(table, now=2.0)
    assert decided == [(f, f.dispatch)]
    assert claim(table, f, f.dispatch)
    assert land(table, f)
    assert not any(claim(table, g, send) for g, send in decided)


def test_a_reply_that_moved_the_flight_on_leaves_a_stale_decision_nothing_to_do() -> None:
    """The flight is still in the air, on its next stage: a failure decided about the
    previous send must not fail the new one over (nor blame the wrong node)."""
    table: dict[int, Flight] = {}
    f = flight_in(table, deadline=1.0)
    decided = expired(table, now=2.0)
    assert claim(table, f, f.dispatch)  # stage a answered
    f.stage = 1
    f.next_send()  # stage b sent, with a fresh deadline
    f.deadline = 5.0
    assert not any(claim(table, g, send) for g, send in decided)
    assert live(table, f)
    assert expired(table, now=2.0) == []


def test_a_node_down_first_makes_the_late_reply_late() -> None:
    table: dict[int, Flight] = {}
    f = flight_in(table)
    old = f.dispatch
    assert claim(table, f, old)  # node-down
    f.next_send()  # the rescue route's send
    assert not claim(table, f, old), "the dead node's late reply acted on the rescue"
    assert claim(table, f, f.dispatch)


def test_a_claimed_send_is_in_no_list_until_the_next_send() -> None:
    """While its claim's holder works (an await, a resend after a reconnect), the flight
    is neither timed out nor failed over by anyone else."""
    table: dict[int, Flight] = {}
    f = flight_in(table, deadline=1.0)
    assert claim(table, f, f.dispatch)
    assert expired(table, now=99.0) == []
    assert waiting_on(table, "a", chained=True) == []


def test_node_down_in_a_chain_waits_on_every_stage_from_the_current_one() -> None:
    table: dict[int, Flight] = {}
    f = flight_in(table)
    assert waiting_on(table, "b", chained=True) == [(f, f.dispatch)]
    assert waiting_on(table, "b", chained=False) == []
    f.stage = 1
    assert waiting_on(table, "a", chained=True) == []


# Everything that can happen to a flight's send, in any order: each outcome path
# (reply, node-down, sweep, failed publish) holds the send it decided on.
Outcome = st.sampled_from(["reply", "node_down", "sweep", "publish_failed", "drain"])


@given(st.lists(st.tuples(Outcome, st.integers(0, 3)), max_size=40))
def test_whatever_the_order_a_send_is_acted_on_once_and_a_flight_answered_once(
    events: list[tuple[str, int]],
) -> None:
    """Outcomes act on the send they saw (``age`` sends ago, as a list taken before an
    await would); whoever claims either sends again or answers. However they
    interleave: each send is claimed at most once, and the flight is answered once."""
    table: dict[int, Flight] = {}
    f = flight_in(table)
    sent = [f.dispatch]
    claims: dict[str, int] = {}
    answers = 0
    for i, (what, age) in enumerate(events):
        send = sent[max(0, len(sent) - 1 - age)]
        if what == "drain":
            answers += land(table, f)
            continue
        if claim(table, f, send):
            claims[send] = claims.get(send, 0) + 1
            if i % 3 == 0:
                answers += land(table, f)  # the last stage answered, or gave up
            else:
                sent.append(f.next_send())  # the next stage, or a rescue
    assert all(n == 1 for n in claims.values())
    assert answers <= 1
    if answers:
        assert not live(table, f)
        assert not any(claim(table, f, s) for s in sent)


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
