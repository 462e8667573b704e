"""The router's desk, driven in memory: a real :class:`SwarmView` over a hand-written
plan, fake nodes that answer whatever it dispatches, and hypothesis over the order in
which requests, replies, failures, deadlines, node-down news, cancels, retries and
claims arrive. No bus, no clock: every event carries its time."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.core import FailoverOptions
from hecate.wire.messages import (
    ErrorBody,
    ErrorReply,
    InferReply,
    InferRequest,
    NodeTelemetry,
    QuotaReply,
    TelemetrySnapshot,
)
from hecate.wire.stages import ActivationReply, OutputReply, StageReply
from hecate_router import desk_flow as d
from hecate_router.config import RouterConfig
from hecate_router.desk import RouterDesk
from hecate_router.flow import Failure
from hecate_router.limits import LimitOptions
from hecate_router.swarmview import SwarmView
from tests.support.builders import pipeline, plan

PLAN = plan(
    [
        pipeline("m-a", "m", ("a0", 0, 4), ("a1", 4, 8)),
        pipeline("m-b", "m", ("b0", 0, 4), ("b1", 4, 8)),
    ]
)
NODES = tuple(n.node_id for n in PLAN.nodes)
WALL = 1_000.0
log = logging.getLogger("test.desk")


def telemetry(wall: float, alive: set[str] | None = None) -> TelemetrySnapshot:
    alive = set(NODES) if alive is None else alive
    return TelemetrySnapshot(
        written_at=wall,
        nodes={n: NodeTelemetry(alive=n in alive, last_seen=wall, latency_ms=5.0) for n in NODES},
    )


def desk(**config: object) -> RouterDesk:
    view = SwarmView(failover=FailoverOptions(), suspect_s=1.0, stale_s=5.0, log=log)
    view.adopt_plan(PLAN, 1, WALL)
    view.adopt_telemetry(telemetry(WALL), WALL, 0.0)
    return RouterDesk(RouterConfig(instance_id="r1", **config), view, flight_prefix="r1-x-")  # type: ignore[arg-type]


def answer(send: d.Dispatch) -> StageReply:
    r = send.send.request
    if r.layer_end < r.model_layers:
        return ActivationReply(activation=bytes([r.layer_end]))
    return OutputReply(output=f"out-{r.model_id}")


@dataclass
class Run:
    """A desk, everything it did, and the checks that hold after every event."""

    desk: RouterDesk
    now: float = 0.0
    calls: int = 0
    out: list[d.Action] = field(default_factory=list)
    answered: dict[int, InferReply | bytes] = field(default_factory=dict)
    forgotten: set[int] = field(default_factory=set)
    sent: dict[int, d.Dispatch] = field(default_factory=dict)  # flight -> its current send
    to: list[str] = field(default_factory=list)  # other replicas' callers answered
    asked_quota: list[int] = field(default_factory=list)
    claims: list[int] = field(default_factory=list)

    def feed(self, ev: d.Event) -> list[d.Action]:
        acts = self.desk.handle(ev)
        for a in acts:
            match a:
                case d.Respond(calls, reply, body, _headers, to):
                    for call in calls:
                        assert call not in self.answered, f"call {call} answered twice"
                        assert call not in self.forgotten
                        self.answered[call] = reply if reply is not None else body
                        self.sent.pop(call, None)
                    self.to += to
                case d.Dispatch(flight):
                    assert flight not in self.answered, "a dispatch after the answer"
                    self.sent[flight] = a
                case d.Forget(call):
                    self.forgotten.add(call)
                case d.AskQuota(call):
                    self.asked_quota.append(call)
                case d.AskOwner(claim):
                    self.claims.append(claim)
        self.out += acts
        return acts

    def arrive(self, prompt: str = "p", **kw: object) -> int:
        self.calls += 1
        request = InferRequest(prompt=prompt, **kw)  # type: ignore[arg-type]
        self.feed(d.Arrived(self.calls, "m", request, f"_INBOX.c{self.calls}", self.now))
        return self.calls

    def reply(self, flight: int, outcome: StageReply | ErrorReply | Failure | None = None) -> None:
        s = self.sent[flight]
        got = answer(s) if outcome is None else outcome
        self.feed(d.StageHeard(flight, s.send.send, s.send.stage, got, self.now))

    def live(self) -> list[int]:
        """Flights whose latest dispatch is the one they wait on."""
        flights = self.desk.flights
        return [
            k
            for k, s in self.sent.items()
            if k in flights and flights[k].machine.send == s.send.send
        ]

    def settle(self) -> None:
        """Healthy nodes answer, and time passes, until nothing is left in the air."""
        for _ in range(500):
            desk = self.desk
            if not (desk.flights or desk.line.models_waiting() or desk.quotas or desk.book.pending):
                return
            self.now += 0.01
            live = self.live()
            if live:
                self.reply(live[0])
            else:
                self.now += 1.0
                self.feed(d.Tick(self.now))
        raise AssertionError("the desk did not settle")

    def reply_of(self, call: int) -> InferReply:
        got = self.answered[call]
        assert isinstance(got, InferReply)
        return got


def idle(desk: RouterDesk) -> None:
    """Nothing held: no flight, no load on any route or pipeline."""
    assert not desk.flights
    assert not any(desk.line.in_flight.values())
    router = desk.view.router
    assert router is not None
    assert not any(router._node_in_flight.values())


# -- one request -------------------------------------------------------------------------


def test_a_request_goes_stage_by_stage_and_is_answered_once() -> None:
    run = Run(desk())
    call = run.arrive("hi")
    assert run.sent[call].send.node_id.endswith("0")
    run.settle()
    reply = run.reply_of(call)
    assert reply.ok
    assert reply.output == "out-m"
    assert reply.request_id == "r1-1", "a request without an id gets the router's"
    idle(run.desk)


def test_without_a_plan_a_request_is_told_so() -> None:
    view = SwarmView(failover=FailoverOptions(), suspect_s=1.0, stale_s=5.0, log=log)
    run = Run(RouterDesk(RouterConfig(instance_id="r1"), view, flight_prefix="r1-x-"))
    call = run.arrive()
    err = run.reply_of(call).error
    assert err is not None
    assert err.code == "no_plan"


def test_a_failed_stage_fails_over_and_the_load_follows() -> None:
    run = Run(desk())
    call = run.arrive()
    first = run.sent[call].send.node_id
    run.reply(call, Failure("no_responders", "no responders"))
    assert any(isinstance(a, d.FailedOver) for a in run.out)
    assert run.sent[call].send.node_id[0] != first[0], "the other replica"
    run.settle()
    assert run.reply_of(call).ok
    idle(run.desk)


# -- retries and cancels -----------------------------------------------------------------


def test_a_retry_joins_its_running_request_and_gets_the_same_answer() -> None:
    run = Run(desk())
    first = run.arrive(request_id="q1")
    again = run.arrive(request_id="q1")
    assert again not in run.answered
    assert again not in run.sent
    assert len(run.desk.flights) == 1
    run.settle()
    assert run.reply_of(first) == run.reply_of(again)


def test_a_retry_after_the_answer_gets_it_again_as_it_was() -> None:
    run = Run(desk())
    first = run.arrive(request_id="q1")
    run.settle()
    again = run.arrive(request_id="q1")
    assert run.answered[again] == msgspec.json.encode(run.reply_of(first))
    assert run.desk.counters["retries_answered_again"] == 1


def test_another_tenant_s_same_request_id_is_another_request() -> None:
    run = Run(desk())
    run.arrive(request_id="q1", tenant="t1")
    run.arrive(request_id="q1", tenant="t2")
    assert len(run.desk.flights) == 2


def test_a_retry_past_the_joined_limit_is_told_to_come_back() -> None:
    run = Run(desk(max_joined_retries=1))
    run.arrive(request_id="q1")
    run.arrive(request_id="q1")
    third = run.arrive(request_id="q1")
    err = run.reply_of(third).error
    assert err is not None
    assert err.code == "rate_limited"


def test_a_cancel_before_the_request_is_remembered_and_answers_it() -> None:
    run = Run(desk())
    run.feed(d.Cancel("default", "q1", run.now))
    call = run.arrive(request_id="q1")
    err = run.reply_of(call).error
    assert err is not None
    assert err.code == "cancelled"
    idle(run.desk)


def test_a_cancel_in_flight_answers_it_and_frees_its_route() -> None:
    run = Run(desk())
    call = run.arrive(request_id="q1")
    run.feed(d.Cancel("default", "q1", run.now))
    err = run.reply_of(call).error
    assert err is not None
    assert err.code == "cancelled"
    idle(run.desk)


def test_a_retry_of_unknown_origin_is_claimed_then_run_when_nobody_owns_it() -> None:
    run = Run(desk())
    call = run.arrive(request_id="q1", attempt=2)
    assert run.claims
    assert call not in run.sent
    run.now += 0.1
    run.feed(d.Tick(run.now))
    assert call in run.sent, "nobody owned it within the claim's time: it runs here"
    run.settle()
    assert run.reply_of(call).ok


def test_a_claimed_retry_whose_owner_answered_is_let_go() -> None:
    run = Run(desk())
    call = run.arrive(request_id="q1", attempt=2)
    run.feed(d.HandedOver(run.claims[-1]))
    assert call in run.forgotten
    run.now += 1.0
    run.feed(d.Tick(run.now))
    assert call not in run.sent


def test_another_replica_s_claim_on_a_running_request_is_owned_and_answered() -> None:
    run = Run(desk())
    run.arrive(request_id="q1")
    acts = run.feed(d.Claimed("default", "q1", "_INBOX.elsewhere"))
    assert any(isinstance(a, d.OwnRetry) for a in acts)
    run.settle()
    assert run.to == ["_INBOX.elsewhere"]
    assert run.feed(d.Claimed("default", "q2", "_INBOX.x")) == [], "not ours: no word"


def test_a_stall_makes_the_next_first_attempts_ask_first() -> None:
    run = Run(desk())
    run.feed(d.Tick(0.0))
    run.now = 1.0  # the process stood still for a second
    call = run.arrive(request_id="q1")
    assert run.claims
    assert call not in run.sent
    assert run.desk.counters["stalls"] == 1


# -- quotas ------------------------------------------------------------------------------


def test_quotas_ask_the_desk_and_admit_refuse_or_serve_without_it() -> None:
    run = Run(desk(enforce_quotas=True))
    admitted, refused, silent = run.arrive(), run.arrive(), run.arrive()
    assert run.asked_quota == [admitted, refused, silent]
    run.feed(d.QuotaAnswered(admitted, QuotaReply(admitted=True), run.now))
    assert admitted in run.sent
    no = QuotaReply(admitted=False, retry_after_s=2.0, ticket=7)
    run.feed(d.QuotaAnswered(refused, no, run.now))
    reply = run.reply_of(refused)
    assert reply.error is not None
    assert reply.error.code == "rate_limited"
    assert reply.quota_ticket == 7
    run.now += 5.0  # past the quota desk's timeout: availability first
    run.feed(d.Tick(run.now))
    assert silent in run.sent
    assert run.desk.counters["quota_unavailable"] == 1
    run.settle()
    idle(run.desk)


# -- the line ----------------------------------------------------------------------------


def test_when_every_pipeline_is_full_requests_wait_in_line_then_run() -> None:
    one = LimitOptions(initial=1.0, floor=1.0, ceiling=1.0)
    run = Run(desk(limits=one))
    calls = [run.arrive() for _ in range(4)]
    assert len(run.sent) == 2, "one per pipeline"
    assert run.desk.line.waiting("m") == 2
    run.settle()
    assert all(run.reply_of(c).ok for c in calls)
    idle(run.desk)


def test_a_wait_past_the_line_s_limit_is_rate_limited_with_a_ticket() -> None:
    one = LimitOptions(initial=1.0, floor=1.0, ceiling=1.0)
    run = Run(desk(limits=one, queue_timeout_s=1.0, queue_max_wait_s=1.0))
    run.arrive(), run.arrive()
    late = run.arrive()
    run.now += 2.0
    run.feed(d.Tick(run.now))
    reply = run.reply_of(late)
    assert reply.error is not None
    assert reply.error.code == "rate_limited"
    assert reply.quota_ticket is not None
    assert reply.quota_ticket < 0


def test_drain_and_stop_answer_the_line_and_every_flight() -> None:
    one = LimitOptions(initial=1.0, floor=1.0, ceiling=1.0)
    run = Run(desk(limits=one))
    calls = [run.arrive() for _ in range(3)]
    run.feed(d.Drain(run.now))
    run.feed(d.Stop(run.now))
    for c in calls:
        err = run.reply_of(c).error
        assert err is not None
        assert err.code == "draining"
    idle(run.desk)


# -- the reconnect window ----------------------------------------------------------------


def test_without_a_reconnect_telemetry_opens_no_window() -> None:
    run = Run(desk())
    run.feed(d.TelemetryHeard(telemetry(WALL + 1), 1.0, WALL + 1))
    assert run.desk.reconnect.at == float("-inf")
    assert (run.desk.reconnect.heard, run.desk.reconnect.down) == ({}, {})


def test_a_reconnect_opens_the_window_and_reads_telemetry_into_it() -> None:
    run = Run(desk())
    snap = telemetry(WALL + 10, alive={"a0", "a1"})
    run.desk.view.adopt_telemetry(snap, WALL + 10, 10.0)
    run.feed(d.Reconnected(9.5, 10.0, WALL + 10))
    window = run.desk.reconnect
    assert window.at == 9.5
    assert window.expected == {"a0", "a1"}
    assert set(window.heard) == {"a0", "a1"}
    assert set(window.down) == {"b0", "b1"}
    grace = run.desk.options.reconnect_grace_s
    late = telemetry(WALL + 10 + grace)
    run.feed(d.TelemetryHeard(late, 9.5 + grace, WALL + 9.5 + grace))  # the window shut
    assert set(window.heard) == {"a0", "a1"}


def test_telemetry_written_before_the_reconnect_says_nothing_of_it() -> None:
    run = Run(desk())
    run.feed(d.Reconnected(10.0, 10.0, WALL + 10))
    run.feed(d.TelemetryHeard(telemetry(WALL + 9), 10.1, WALL + 10.1))
    assert run.desk.reconnect.heard == {}


# -- any order ---------------------------------------------------------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "arrive",
                "retry",
                "ok",
                "error",
                "no_responders",
                "node_down",
                "tick",
                "cancel",
                "claim",
                "stall",
            ]
        ),
        st.integers(0, 7),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, limit=st.sampled_from([1.0, 4.0]), quotas=st.booleans())
def test_whatever_the_order_every_call_is_answered_once_and_the_load_comes_back_to_zero(
    ops: list[tuple[str, int]], limit: float, quotas: bool
) -> None:
    run = Run(
        desk(limits=LimitOptions(initial=limit, floor=1.0, ceiling=limit), enforce_quotas=quotas)
    )
    for kind, n in ops:
        run.now += 0.01
        flights = run.live()
        pick = flights[n % len(flights)] if flights else None
        if kind == "arrive":
            run.arrive(request_id=f"q{n}" if n % 2 else "")
        elif kind == "retry":
            run.arrive(request_id=f"q{n | 1}", attempt=2)
        elif kind == "ok" and pick is not None:
            run.reply(pick)
        elif kind == "error" and pick is not None:
            run.reply(pick, ErrorReply(error=ErrorBody(code="internal", message="boom")))
        elif kind == "no_responders" and pick is not None:
            run.reply(pick, Failure("no_responders", "no responders"))
        elif kind == "node_down":
            run.feed(d.NodeDown(NODES[n % len(NODES)], "silent", run.now))
        elif kind == "tick":
            run.now += 0.5 * n
            run.feed(d.Tick(run.now))
        elif kind == "cancel":
            run.feed(d.Cancel("default", f"q{n | 1}", run.now))
        elif kind == "claim":
            run.feed(d.Claimed("default", f"q{n | 1}", f"_INBOX.other{n}"))
        elif kind == "stall":
            run.now += 1.0
        for call in list(run.asked_quota):
            run.asked_quota.remove(call)
            run.feed(d.QuotaAnswered(call, QuotaReply(admitted=n % 3 != 0), run.now))
    run.settle()
    # Every call is answered once, or let go to the replica that owns it.
    assert set(run.answered) | run.forgotten == set(range(1, run.calls + 1))
    assert not set(run.answered) & run.forgotten
    idle(run.desk)
