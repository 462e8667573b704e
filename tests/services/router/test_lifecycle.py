"""The request lifecycle, driven in memory: a real chooser over a hand-written swarm,
fake nodes that answer whatever the machine sends, and hypothesis over the order in
which replies, failures, deadlines, node-down news, cancels and joins arrive."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.core import (
    FailoverOptions,
    ModelSpec,
    NodeState,
    Recovered,
    Route,
    RoutingRequest,
    Unrecoverable,
)
from hecate.core.chooser import Chooser
from hecate.model.executor import ExecutorKind
from hecate.wire.messages import (
    ErrorBody,
    ErrorReply,
    Failover,
    InferRequest,
    OutputFormat,
    TokenLogprob,
)
from hecate.wire.stages import ActivationReply, OutputReply, StageReply, StepStage, TokenReply
from hecate_router import states
from hecate_router.flow import (
    Abort,
    Action,
    Answer,
    Cancelled,
    Event,
    Failure,
    FlowOptions,
    Move,
    NodeDown,
    Release,
    Report,
    RetryJoined,
    Send,
    StageFailed,
    StageReplied,
    Start,
    Stream,
    Suspect,
    Tick,
)
from hecate_router.lifecycle import Lifecycle
from hecate_router.states import TRANSITIONS, IllegalMove, State
from tests.support.builders import pipeline, plan

RACKS = ("a", "b", "c")
# Three copies of a 3-stage model on the same boundaries, and a one-node reserve model.
PLAN = plan(
    [
        *(
            pipeline(f"m-r{i}", "m", *((f"{x}{k}", 4 * k, 4 * k + 4) for k in range(3)))
            for i, x in enumerate(RACKS)
        ),
        pipeline("mini-r0", "mini", ("r", 0, 4)),
    ],
    models=[
        ModelSpec(model_id="m", layers=12),
        ModelSpec(model_id="mini", layers=4, role="reserve"),
    ],
)
NODES = tuple(n.node_id for n in PLAN.nodes)
PROMPT_IDS = [5, 6, 7, 8]


@dataclass
class Swarm:
    """The :class:`Routes` a machine sees: a real chooser, and a breaker's probe leases
    kept as a ledger so the tests can see each probe delivered or given back once."""

    generative: bool = False
    leased: set[str] = field(default_factory=set)
    taken: Counter[str] = field(default_factory=Counter)
    returned: Counter[str] = field(default_factory=Counter)
    chooser: Chooser = field(init=False)
    epoch: int = 1

    def __post_init__(self) -> None:
        self.chooser = Chooser(FailoverOptions(allow_degraded=True, reserve_model="mini"))
        nodes = {n: NodeState(alive=True, last_seen=50.0) for n in NODES}
        self.chooser.observe(PLAN, nodes, now=100.0)

    def layers(self, model_id: str) -> int:
        return 12 if model_id == "m" else 4

    def keeps_sessions(self, model_id: str) -> bool:
        return self.generative and model_id == "m"

    def executor_kind(self, model_id: str) -> ExecutorKind:
        return "steps" if self.keeps_sessions(model_id) else "layers"

    def rescue(self, route: Route, lost: str, request: RoutingRequest) -> Recovered | Unrecoverable:
        return self.chooser.rescue(route, lost, request)

    def suspect(self, node_id: str) -> None:
        self.chooser.suspect(node_id, 100.0)

    def take(self, route: Route) -> set[str]:
        got = self.leased & set(route.node_ids)
        self.leased -= got
        self.taken.update(got)
        return got

    def give_back(self, probes: set[str]) -> None:
        self.returned.update(probes)


def machine(
    swarm: Swarm,
    *,
    max_tokens: int = 3,
    stop: list[str] | None = None,
    chain: bool = False,
    shape: OutputFormat | None = None,
    logprobs: int | None = None,
) -> Lifecycle:
    route, degraded = swarm.chooser.choose("m", RoutingRequest(tokens=max_tokens))
    request = InferRequest(
        prompt="hi",
        max_tokens=max_tokens,
        stream=True,
        stop=stop or [],
        output_format=shape,
        logprobs=logprobs,
    )
    m = Lifecycle(
        request=request,
        request_id="r1",
        flight_id="router-1-f00d-1",
        model_id="m",
        route=route,
        routes=swarm,
        options=FlowOptions(chain=chain),
        counters=Counter(),
        degraded=degraded,
    )
    m.probes = swarm.take(route)
    return m


def answer(send: Send) -> StageReply:
    """What a healthy node says to ``send``: a generative model's stages are steps."""
    r = send.request
    step = r if isinstance(r, StepStage) else None
    said = PROMPT_IDS if step and step.tokens is None and r.layer_start == 0 else None
    if r.layer_end < r.model_layers and not send.chained:
        return ActivationReply(activation=bytes([r.layer_end]), prompt_tokens=said)
    if step is None:
        return OutputReply(output=f"out-{r.model_id}")
    token = 10 + step.step
    logprob = TokenLogprob(token, b"t", -0.5, []) if step.logprobs is not None else None
    return TokenReply(prompt_tokens=said, token=token, text=f"t{step.step} ", logprob=logprob)


@dataclass
class Run:
    """A machine, everything it did, and the checks that hold after every event."""

    m: Lifecycle
    first: Route = field(init=False)
    actions: list[Action] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)
    acted: set[int] = field(default_factory=set)
    delivered: Counter[str] = field(default_factory=Counter)  # probes reported while held
    now: float = 0.0

    def __post_init__(self) -> None:
        self.first = self.m.route

    def feed(self, event: Event) -> list[Action]:
        done_before = self.m.state is State.DONE
        before = (self.m.state, self.m.send, self.m.stage, self.m.resend_at)
        due = isinstance(event, Tick) and self.m.due(event.now)
        held = set(self.m.probes)
        out = self.m.handle(event)
        for a in out:
            if isinstance(a, Suspect):  # what the router's shell does with it
                cast(Swarm, self.m.routes).suspect(a.node_id)
            if isinstance(a, Report) and a.node_id in held:
                held.discard(a.node_id)
                self.delivered[a.node_id] += 1
        after = (self.m.state, self.m.send, self.m.stage, self.m.resend_at)
        if isinstance(event, Tick):  # the sweep may skip exactly the ticks that do nothing
            assert due == bool(out or before != after)
        assert not (done_before and out), "a finished request acts on nothing"
        if isinstance(event, StageReplied | StageFailed) and (out or before != after):
            assert event.send not in self.acted, "each send is acted on once"
            # (but for the chunks a chain's first stage runs ahead: each says more follow)
            if not (isinstance(event, StageReplied) and getattr(event.reply, "more", False)):
                self.acted.add(event.send)
        for i, a in enumerate(out):
            if isinstance(a, Send):
                assert i == len(out) - 1, "a send is the last thing a step does"
                self.sends.append(a)
            if isinstance(a, Answer):
                assert all(isinstance(b, Release) for b in out[i + 1 :])
        self.actions += out
        return out

    @property
    def last(self) -> Send:
        return self.sends[-1]

    def reply_ok(self) -> list[Action]:
        s = self.last
        stage = s.stage + s.chained
        reply = answer(s)
        return self.feed(StageReplied(s.send, stage, reply, self.now))

    def finish(self) -> None:
        """Let healthy nodes answer until the request is answered."""
        for _ in range(200):
            if self.m.state is State.DONE:
                return
            self.now += 0.01
            if self.m.state in (State.RESENDING, State.WAITING):
                self.now += 1.0
                self.feed(Tick(self.now))
            else:
                self.reply_ok()
        raise AssertionError("no answer after 200 steps")

    def answers(self) -> list[Answer]:
        return [a for a in self.actions if isinstance(a, Answer)]


def started(swarm: Swarm, **kw: object) -> Run:
    run = Run(machine(swarm, **kw))  # type: ignore[arg-type]
    run.feed(Start(0.0))
    return run


# -- the table ----------------------------------------------------------------------------


def test_every_state_but_done_has_a_way_out_and_done_has_none() -> None:
    exits = {s for (s, _), targets in TRANSITIONS.items() for t in targets if t is not s}
    assert exits == {State.NEW, State.SENT, State.RESENDING, State.WAITING}
    assert not any(s is State.DONE for s, _ in TRANSITIONS)


def test_a_move_the_table_does_not_hold_raises_even_under_python_o() -> None:
    assert states.move(State.SENT, Tick(1.0), State.WAITING) is State.WAITING
    with pytest.raises(IllegalMove, match=r"Tick cannot move a request from State\.RESENDING"):
        states.move(State.RESENDING, Tick(1.0), State.DONE)
    with pytest.raises(IllegalMove):
        states.move(State.DONE, Cancelled(1.0), State.DONE)  # no row at all


def test_a_failed_stage_asks_the_shell_to_suspect_its_node_before_any_resend() -> None:
    run = Run(machine(Swarm()))
    run.feed(Start(0.0))
    lost = run.last.node_id
    out = run.feed(StageFailed(run.last.send, 0, Failure("error_reply", "boom", "internal"), 0.1))
    assert Suspect(lost) in out
    assert out.index(Suspect(lost)) < len(out) - 1  # the rescue's send comes after it


# -- the plain paths ----------------------------------------------------------------------


def test_a_request_goes_stage_by_stage_and_is_answered_once() -> None:
    run = started(Swarm())
    run.finish()
    assert [s.stage for s in run.sends] == [0, 1, 2]
    [a] = run.answers()
    assert a.reply.ok
    assert a.reply.output == "out-m"
    assert a.also == ()
    assert run.m.counters["answered"] == 1


def test_a_generation_streams_each_token_and_counts_what_it_cost() -> None:
    swarm = Swarm(generative=True)
    run = started(swarm, max_tokens=3)
    run.finish()
    tokens = [a.token for a in run.actions if isinstance(a, Stream)]
    assert [t.index for t in tokens] == [0, 1, 2]
    [a] = run.answers()
    assert a.reply.output == "t0 t1 t2 "
    assert (a.reply.prompt_tokens, a.reply.completion_tokens, a.reply.finish_reason) == (
        4,
        3,
        "length",
    )
    assert isinstance(run.actions[-1], Release)  # the nodes drop the session after


def test_the_stage_that_samples_gets_the_shape_and_the_tokens_so_far_and_says_logprobs() -> None:
    shape = OutputFormat(type="json_object")
    run = started(Swarm(generative=True), shape=shape, logprobs=2)
    run.finish()
    last = [s.request for s in run.sends if s.stage == 2]
    assert all(isinstance(r, StepStage) for r in last)
    assert [r.sampled for r in last if isinstance(r, StepStage)] == [[], [10], [10, 11]]
    assert all(
        r.output_format == shape and r.logprobs == 2 for r in last if isinstance(r, StepStage)
    )
    before = [s.request for s in run.sends if s.stage < 2]
    assert all(isinstance(r, StepStage) and r.output_format is None for r in before)
    streamed = [a.token for a in run.actions if isinstance(a, Stream)]
    assert [t.logprob.token for t in streamed if t.logprob] == [10, 11, 12]
    [a] = run.answers()
    assert [e.token for e in a.reply.logprobs or []] == [10, 11, 12]


@pytest.mark.parametrize(
    ("ask", "words"),
    [
        ({"shape": OutputFormat(type="json_object")}, "give its answer the shape 'json_object'"),
        ({"logprobs": 0}, "give log-probabilities"),
    ],
)
def test_a_model_that_does_not_sample_refuses_a_shape_or_logprobs_by_name(
    ask: dict[str, object], words: str
) -> None:
    run = started(Swarm(), **ask)
    assert run.sends == []
    [a] = run.answers()
    assert a.reply.error is not None
    assert a.reply.error.code == "bad_request"
    assert words in a.reply.error.message


def test_a_stop_string_ends_the_generation_without_it() -> None:
    run = started(Swarm(generative=True), max_tokens=8, stop=["t2"])
    run.finish()
    [a] = run.answers()
    assert a.reply.output == "t0 t1 "
    assert a.reply.finish_reason == "stop"


def test_a_late_reply_of_an_old_send_is_ignored_and_counted() -> None:
    run = started(Swarm())
    first = run.last
    run.reply_ok()
    out = run.feed(StageReplied(first.send, 0, answer(first), 0.0))
    assert out == []
    assert run.m.counters["late_replies"] == 1


# -- failures -----------------------------------------------------------------------------


def test_no_responders_moves_to_another_replica_and_resumes_where_it_was() -> None:
    run = started(Swarm())
    run.reply_ok()  # stage 0 done: the activation entering layer 4 is held
    lost = run.last.node_id
    failure = Failure("no_responders", "no responders")
    out = run.feed(StageFailed(run.last.send, 1, failure, 0.1))
    failover = next(a for a in out if isinstance(a, Failover))
    assert failover.lost_node == lost
    assert failover.kind in ("replica", "splice")
    assert any(isinstance(a, Move) for a in out)
    assert not any(isinstance(a, Report) for a in out)  # silence is telemetry's news
    assert run.last.stage == 1
    assert run.last.node_id != lost
    run.finish()
    assert run.answers()[0].reply.attempts == 2


def test_a_generation_s_sessions_are_named_by_the_flight_never_by_the_caller_s_id() -> None:
    """The request_id is the caller's to choose (and another tenant's to reuse): the
    nodes' caches are named by the router's flight id, a fresh one per attempt."""
    run = started(Swarm(generative=True), max_tokens=3)
    run.reply_ok()
    run.feed(StageFailed(run.last.send, 1, Failure("no_responders", "no responders"), 0.1))
    run.finish()
    steps = [s.request for s in run.sends if isinstance(s.request, StepStage)]
    released = [a.session for a in run.actions if isinstance(a, Release)]
    flight = run.m.flight_id
    assert {r.session for r in steps} == {f"{flight}.1", f"{flight}.2"}
    assert released == [f"{flight}.1", f"{flight}.2"]
    assert not any(run.m.request_id in r.session for r in steps)


def test_an_error_reply_is_reported_to_the_breaker_with_its_code() -> None:
    run = started(Swarm())
    err = ErrorReply(error=ErrorBody(code="overloaded", message="busy"))
    out = run.feed(StageReplied(run.last.send, 0, err, 0.1))
    assert Report(run.sends[0].node_id, False, "overloaded", None) in out


def test_the_request_s_own_fault_is_answered_without_a_failover() -> None:
    run = started(Swarm())
    err = ErrorReply(error=ErrorBody(code="prompt_too_long", message="long"))
    out = run.feed(StageReplied(run.last.send, 0, err, 0.1))
    assert not any(isinstance(a, Failover) for a in out)
    [a] = run.answers()
    assert a.reply.error is not None
    assert a.reply.error.code == "prompt_too_long"


def test_a_stage_past_its_deadline_fails_over_once() -> None:
    run = started(Swarm())
    assert run.feed(Tick(1.0)) == []  # before the deadline: nothing
    out = run.feed(Tick(2.5))
    assert sum(isinstance(a, Failover) for a in out) == 1
    assert run.feed(Tick(2.6)) == []  # the new send has its own deadline


def test_no_responders_right_after_a_reconnect_resends_without_blame() -> None:
    run = started(Swarm())
    run.m.reconnect.reconnected(0.0, expected=NODES)
    send = run.last
    out = run.feed(StageFailed(send.send, 0, Failure("no_responders", "no responders"), 0.5))
    assert out == []
    assert run.m.state is State.RESENDING
    assert run.feed(NodeDown(send.node_id, "silent", 0.55)) == []  # no send is out
    out = run.feed(Tick(0.7))
    assert isinstance(out[-1], Send)
    assert out[-1].node_id == send.node_id
    assert out[-1].send != send.send


def test_too_large_is_the_request_s_fault_not_a_node_s() -> None:
    run = started(Swarm())
    run.feed(StageFailed(run.last.send, 0, Failure("too_large", "the prompt is too long"), 0.1))
    [a] = run.answers()
    assert a.reply.error is not None
    assert a.reply.error.code == "payload_too_large"


def test_a_cancel_answers_cancelled_with_the_text_so_far() -> None:
    run = started(Swarm(generative=True), max_tokens=8)
    for _ in range(3 * 2):
        run.reply_ok()
    run.feed(Cancelled(1.0))
    [a] = run.answers()
    assert a.reply.error is not None
    assert a.reply.error.code == "cancelled"
    assert a.reply.output == "t0 t1 "


def test_a_retry_that_joined_gets_the_same_answer() -> None:
    run = started(Swarm())
    run.feed(RetryJoined("retry-inbox"))
    run.finish()
    assert run.answers()[0].also == ("retry-inbox",)


# -- no route left: waiting for one --------------------------------------------------------


def only_alive(swarm: Swarm, alive: set[str], heard: float = 50.0) -> None:
    """Telemetry's news: these nodes alive (last heard at ``heard``), the others down."""
    nodes = {n: NodeState(alive=n in alive, last_seen=heard if n in alive else 1.0) for n in NODES}
    swarm.chooser.observe(PLAN, nodes, now=100.0)


def test_a_silence_that_leaves_no_route_waits_and_takes_the_first_route_back() -> None:
    swarm = Swarm()
    run = started(swarm)
    lost = run.last.node_id
    rack = lost[0]
    # The rest of the swarm went silent with it (a partition, say): no route is left.
    only_alive(swarm, {n for n in NODES if n.startswith(rack)} - {lost})
    out = run.feed(NodeDown(lost, "silent for 500 ms", 0.5))
    assert out == [Suspect(lost)]  # suspected; no failover told, no answer: held
    assert run.m.state is State.WAITING
    assert run.m.counters["held_for_route"] == 1
    assert run.feed(NodeDown(lost, "silent", 0.6)) == []  # nothing is out to fail
    assert run.feed(Tick(0.55)) == []  # before the next look: nothing
    assert run.feed(Tick(1.0)) == []  # looked: still nothing
    other = next(r for r in RACKS if r != rack)
    only_alive(swarm, {n for n in NODES if n.startswith(other)}, heard=101.0)
    out = run.feed(Tick(3.0))
    [told] = [a for a in out if isinstance(a, Failover)]
    assert (told.lost_node, told.kind) == (lost, "replica")
    assert "held 2.5 s for a route" in told.reason
    assert any(isinstance(a, Move) for a in out)
    assert run.last.node_id.startswith(other)
    run.finish()
    [a] = run.answers()
    assert a.reply.ok
    assert a.reply.attempts == 2
    assert run.m.counters["route_came_back"] == 1


def test_the_node_that_went_silent_coming_back_takes_its_request_back() -> None:
    swarm = Swarm()
    run = started(swarm)
    lost = run.last.node_id
    only_alive(swarm, set())
    run.feed(NodeDown(lost, "silent", 0.5))
    assert run.m.state is State.WAITING
    only_alive(swarm, set(NODES), heard=101.0)  # heard again since it was suspected
    out = run.feed(Tick(1.0))
    [told] = [a for a in out if isinstance(a, Failover)]
    assert told.kind == "unaffected"
    assert run.last.node_id == lost


def test_a_wait_that_ends_with_no_route_is_unrecoverable_and_says_how_long() -> None:
    swarm = Swarm()
    run = started(swarm)
    only_alive(swarm, set())
    sent = run.last
    run.feed(StageFailed(sent.send, 0, Failure("timeout", "no reply within 2.0 s"), 2.0))
    assert run.m.state is State.WAITING
    wait = run.m.options.route_wait_s
    assert run.feed(Tick(2.0 + wait - 0.05)) == []
    out = run.feed(Tick(2.0 + wait + 0.01))
    [told] = [a for a in out if isinstance(a, Failover)]
    assert told.kind == "unrecoverable"
    [a] = run.answers()
    assert a.reply.error is not None
    assert a.reply.error.code == "unrecoverable"
    assert f"no route came back within {wait:.1f} s" in a.reply.error.message
    assert run.m.counters["waited_out"] == 1


def test_an_error_that_leaves_no_route_is_answered_at_once() -> None:
    swarm = Swarm()
    run = started(swarm)
    only_alive(swarm, set())
    err = ErrorReply(error=ErrorBody(code="internal", message="boom"))
    run.feed(StageReplied(run.last.send, 0, err, 0.1))
    [a] = run.answers()
    assert a.reply.error is not None
    assert a.reply.error.code == "unrecoverable"


def test_no_wait_when_it_is_off() -> None:
    swarm = Swarm()
    run = Run(machine(swarm))
    run.m.options = FlowOptions(route_wait_s=0.0)
    run.feed(Start(0.0))
    only_alive(swarm, set())
    run.feed(NodeDown(run.last.node_id, "silent", 0.5))
    [a] = run.answers()
    assert a.reply.error is not None
    assert a.reply.error.code == "unrecoverable"


def test_a_waiting_request_can_be_cancelled_and_joined() -> None:
    swarm = Swarm()
    run = started(swarm)
    only_alive(swarm, set())
    run.feed(NodeDown(run.last.node_id, "silent", 0.5))
    run.feed(RetryJoined("retry-inbox"))
    run.feed(Cancelled(0.7))
    [a] = run.answers()
    assert a.also == ("retry-inbox",)
    assert a.reply.error is not None
    assert a.reply.error.code == "cancelled"


# -- any order ----------------------------------------------------------------------------

Op = tuple[str, int]
ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "ok",
                "error",
                "no_responders",
                "stale",
                "tick",
                "node_down",
                "cancel",
                "join",
                "abort",
                "blackout",
                "heal",
            ]
        ),
        st.integers(0, len(NODES) - 1),
    ),
    max_size=40,
)


def apply(run: Run, op: Op) -> None:
    kind, n = op
    run.now += 0.05
    live = run.m.state is State.SENT
    s = run.last
    if kind == "ok" and live:
        run.reply_ok()
    elif kind == "error" and live:
        err = ErrorReply(error=ErrorBody(code="internal", message="boom"))
        run.feed(StageReplied(s.send, s.stage + s.chained, err, run.now))
    elif kind == "no_responders" and live:
        failure = Failure("no_responders", "no responders")
        run.feed(StageFailed(s.send, s.stage, failure, run.now))
    elif kind == "stale":
        old = run.sends[n % len(run.sends)]
        if old.send != run.m.send:
            reply = answer(old)
            run.feed(StageReplied(old.send, old.stage + old.chained, reply, run.now))
    elif kind == "tick":
        run.now += 1.0 * n
        run.feed(Tick(run.now))
    elif kind == "node_down":
        run.feed(NodeDown(NODES[n], "silent", run.now))
    elif kind == "cancel":
        run.feed(Cancelled(run.now))
    elif kind == "join":
        run.feed(RetryJoined(f"retry-{n}"))
    elif kind == "abort":
        run.feed(Abort("draining", "router stopped", run.now))
    elif kind == "blackout":  # every node but a few falls silent at once
        only_alive(run.m.routes, {NODES[n]})  # type: ignore[arg-type]
    elif kind == "heal":
        only_alive(run.m.routes, set(NODES), heard=101.0)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    ops=ops,
    generative=st.booleans(),
    probes=st.frozensets(st.sampled_from(NODES)),
    reconnected=st.booleans(),
    chain=st.booleans(),
)
def test_whatever_the_order_one_answer_balanced_load_bounded_replays_one_probe(
    ops: list[Op], generative: bool, probes: frozenset[str], reconnected: bool, chain: bool
) -> None:
    swarm = Swarm(generative=generative, leased=set(probes))
    run = started(swarm, max_tokens=3, chain=chain)
    if reconnected:
        run.m.reconnect.reconnected(0.0, expected=NODES)
    for op in ops:
        apply(run, op)
    run.finish()
    # Exactly one reply per request, whatever raced.
    assert len(run.answers()) == 1
    # The load it put on routes: one begin (the start) plus one per move, as many ends.
    # Each move leaves the route the load was on; the answer ends the last one.
    routes = [run.first]
    for move in (a for a in run.actions if isinstance(a, Move)):
        assert move.old == routes[-1]
        routes.append(move.new)
    assert run.answers()[0].route == routes[-1]
    # Attempts and replays stay within their limits.
    assert run.m.attempts <= run.m.options.max_attempts
    assert run.m.gen.replays <= run.m.options.max_replays
    # Each probe taken is delivered (reported while the request held it) or given
    # back, once. (After a heal a request may come back to a target whose probe it gave
    # back: that report is an ordinary outcome, not a delivery.)
    for target, n in swarm.taken.items():
        assert n == 1
        assert swarm.returned[target] + run.delivered[target] == 1, target
    assert not set(swarm.returned) - set(swarm.taken)


def test_a_later_stage_takes_as_many_cached_positions_as_the_first_and_the_tenant_scopes_it() -> (
    None
):
    run = started(Swarm(generative=True), max_tokens=2)
    first = run.last.request
    assert isinstance(first, StepStage)
    assert first.cache_scope == "default"  # the tenant the desk put in the request
    assert first.reused == 0
    took = ActivationReply(activation=b"\x01", prompt_tokens=PROMPT_IDS, positions=4, reused=2)
    run.feed(StageReplied(run.last.send, 0, took, 0.01))
    second = run.last.request
    assert isinstance(second, StepStage)
    assert second.reused == 2
    assert second.prompt_tokens == PROMPT_IDS  # each stage names the prompt's blocks
    run.finish()
    steps = [s.request for s in run.sends if isinstance(s.request, StepStage)]
    later = [r for r in steps if r.position > 0]
    assert later
    assert all(r.reused == 0 for r in later)  # only a session's first step takes any


def test_a_stage_that_lost_the_prefix_starts_the_step_over_whole_blaming_nobody() -> None:
    run = started(Swarm(generative=True), max_tokens=2)
    took = ActivationReply(activation=b"\x01", prompt_tokens=PROMPT_IDS, positions=4, reused=2)
    run.feed(StageReplied(run.last.send, 0, took, 0.01))
    session = run.m.session
    lost = ErrorReply(error=ErrorBody(code="prefix_lost", message="evicted"))
    out = run.feed(StageReplied(run.last.send, 1, lost, 0.02))
    assert not any(isinstance(a, Report | Suspect | Failover) for a in out)
    assert Release(run.m.route, session) in out  # the half-built session goes
    again = run.last.request
    assert isinstance(again, StepStage)
    assert (run.last.stage, again.cache_scope, again.reused) == (0, None, 0)
    assert run.m.session != session
    assert run.m.route == run.first
    run.finish()
    [a] = run.answers()
    assert a.reply.ok
    assert run.m.counters["prefix_lost"] == 1


# -- a long prompt's chunks, run ahead down a chain --------------------------------------


def test_a_chain_s_first_stage_runs_a_long_prompt_ahead_and_each_chunk_answers_on_one_send() -> (
    None
):
    run = started(Swarm(generative=True), chain=True, max_tokens=2)
    sent = run.last
    assert isinstance(sent.request, StepStage)
    assert sent.request.run_ahead  # the first stage of a chain may run the chunks ahead
    last = sent.stage + sent.chained
    prompt = list(range(100, 110))  # ten positions, run as 4 + 4 + 2
    timeout = run.m.options.stage_timeout_s
    for at, (ran, more) in enumerate([(4, True), (4, True)], start=1):
        now = at * 2 * timeout  # each chunk a while after the one before
        chunk = TokenReply(token=1, positions=ran, prompt_tokens=prompt, more=more)
        out = run.feed(StageReplied(sent.send, last, chunk, now))
        assert not any(isinstance(a, Send | Stream) for a in out)  # nothing sent
        assert (run.m.state, run.m.send, run.m.stage) == (State.SENT, sent.send, 0)
        assert not run.m.due(now + timeout * 3 - 0.01)  # the deadline runs from this chunk
    assert run.m.gen.position == 8
    final = TokenReply(token=42, text="t0 ", positions=2, prompt_tokens=prompt)
    out = run.feed(StageReplied(sent.send, last, final, 5 * timeout))
    assert [a.token.token for a in out if isinstance(a, Stream)] == [42]  # only the real token
    step = run.last.request
    assert run.last.send != sent.send
    assert isinstance(step, StepStage)
    assert (step.tokens, step.position) == ([42], 10)
    assert run.m.counters["prefill_chunks"] == 2


def test_chunks_go_one_send_each_when_the_router_may_not_run_them_ahead() -> None:
    # Hop by hop the router itself sends every stage; down a chain it is an option
    # (nodes that do not run ahead answer one chunk a send).
    hop = started(Swarm(generative=True), chain=False)
    assert isinstance(hop.last.request, StepStage)
    assert not hop.last.request.run_ahead
    m = machine(Swarm(generative=True), chain=True)
    m.options = FlowOptions(chain=True, run_ahead=False)
    run = Run(m)
    run.feed(Start(0.0))
    sent = run.last
    assert isinstance(sent.request, StepStage)
    assert not sent.request.run_ahead
    chunk = TokenReply(token=1, positions=4, prompt_tokens=list(range(10)))
    out = run.feed(StageReplied(sent.send, sent.stage + sent.chained, chunk, 0.1))
    [again] = [a for a in out if isinstance(a, Send)]
    assert isinstance(again.request, StepStage)
    assert (again.request.position, again.request.tokens) == (4, list(range(4, 10)))
