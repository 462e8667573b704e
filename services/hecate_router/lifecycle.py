"""One request's life in a router, as a pure state machine: ``handle(event) -> actions``.

No I/O, no clock (events carry the time), no tasks. The router service maps what it
hears to events (flow.py) and runs the actions; the tests drive the machine in memory.

Its states and the table of what may move it between them are in
:mod:`hecate_router.states`: every change of state goes through that table, and a move
it does not hold raises.

**The one rule:** an outcome (reply or failure) acts only on the dispatch that is
current: each send is numbered, and an outcome naming any other number (a late reply,
a failure of a send already replaced by a resend or a rescue) is ignored and counted.
So whatever order replies, deadlines and node-down news arrive in, each send is acted
on once and the request is answered once (a chain's first stage running a long prompt
ahead answers once a chunk, in order, each reply but the last marked ``more``).

What a failed dispatch does (resend, reroute, wait for a route, or answer) is
:mod:`hecate_router.losses`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hecate.core import Route
from hecate.core.errors import ErrorCode
from hecate.model.executor import ExecutorKind
from hecate.wire.messages import ErrorBody, ErrorReply, InferReply, InferRequest
from hecate.wire.stages import ActivationReply, OutputReply, TokenReply
from hecate_router import flow, losses
from hecate_router.flow import (
    Action,
    Answer,
    Event,
    Failure,
    FlowOptions,
    Release,
    Report,
    Routes,
    Sample,
    Send,
    Stream,
)
from hecate_router.generation import Generation
from hecate_router.hearing import Hearing
from hecate_router.losses import Held
from hecate_router.reconnect import ReconnectWindow
from hecate_router.rescue import GiveUp, classify
from hecate_router.stages import Dispatch, stage_request, unsupported
from hecate_router.states import State, accepts, move

S = State


@dataclass(eq=False)
class Lifecycle:
    """One inference request on its way through the swarm."""

    request: InferRequest
    request_id: str  # the caller's, for its retries only: callers choose it
    model_id: str  # as asked for: a reserve model's route answers under this name
    route: Route
    routes: Routes
    options: FlowOptions
    counters: Counter[str]
    degraded: bool = False
    probes: set[str] = field(default_factory=set)  # half-open targets whose probe we carry
    reconnect: ReconnectWindow = field(default_factory=ReconnectWindow)  # shared, the router's
    hearing: Hearing = field(default_factory=Hearing)  # shared, the router's
    state: State = State.NEW
    stage: int = 0
    attempts: int = 1
    send: int = 0  # the current dispatch (0: none out)
    sends: int = 0
    deadline: float = 0.0
    sent_at: float = 0.0  # when the current dispatch went out
    resend_at: float = 0.0
    excused_since: float | None = None  # the first failure excused as the router's own
    held: Held | None = None  # waiting for a route: whose silence left none, since when
    resent: bool = False  # a resend's wait is in its round trips: no sample of the pipeline
    started: float = 0.0
    step_at: float = 0.0
    acts: dict[int, bytes] = field(default_factory=lambda: {0: b""})  # input of layer L
    also_reply_to: list[str] = field(default_factory=list)
    # The router's own name for this flight, unique across router replicas and their
    # restarts: a node's session (its KV caches) is named by it, never by anything a
    # caller chooses, so one caller's id can never drop or continue another's cache.
    flight_id: str = ""
    session: str = ""
    gen: Generation = field(default_factory=Generation)  # a generative model's token loop
    # A layer network's counts, in its tokens: the prompt's (from the stage that embedded
    # it, or a chain's end) and the decoded text's (from the route's end).
    prompt_count: int | None = None
    completion_count: int | None = None
    kinds: dict[str, ExecutorKind] = field(default_factory=dict)  # what executes each model
    # The event being handled and the state it found: what bounds each move (_to).
    _event: Event | None = field(default=None, repr=False)
    _from: State = field(default=State.NEW, repr=False)

    def __post_init__(self) -> None:
        if not self.flight_id:
            raise ValueError("a flight needs the router's own flight_id")
        self.session = f"{self.flight_id}.1"

    # -- the one entry point ----------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        if not accepts(self.state, event) or not self._current(event):
            self._ignored(event)
            return []
        self._event, self._from = event, self.state
        out: list[Action] = []
        match event:
            case flow.Start(now):
                self.started = now
                self._dispatch(now, out)
            case flow.StageReplied():
                self._replied(event, out)
            case flow.StageFailed(_, stage, failure, now):
                self.stage = max(self.stage, stage)
                losses.failed(self, self.route.stages[self.stage].node_id, failure, now, out)
            case flow.NodeDown(node_id, reason, now):
                why = Failure("node_down", f"node down: {reason}")
                losses.failed(self, node_id, why, now, out)
            case flow.Tick(now) if self.state is S.RESENDING:
                if now >= self.resend_at:
                    self._dispatch(now, out)
            case flow.Tick(now) if self.state is S.WAITING:
                if now >= self.resend_at:
                    losses.look_again(self, now, out)
            case flow.Tick(now):
                if now > self.deadline:
                    s = self.options.stage_timeout_s
                    why = Failure("timeout", f"no reply within {s:.1f} s")
                    losses.failed(self, self.route.stages[self.stage].node_id, why, now, out)
            case flow.RetryJoined(reply_to):
                if reply_to:
                    self.also_reply_to.append(reply_to)
            case flow.Cancelled(now):
                self.counters["cancelled"] += 1
                self._error("cancelled", "the caller cancelled the request", out)
            case flow.Abort(code, message, now):
                self._error(code, message, out)
        return out

    def _to(self, state: State) -> None:
        """Every change of state: only what the table lets the event in hand do."""
        assert self._event is not None
        self.state = move(self._from, self._event, state)

    def due(self, now: float) -> bool:
        """Whether a :class:`Tick` at ``now`` would do anything (a deadline passed, or a
        resend is due): the shell's sweep skips the rest."""
        if self.state is S.SENT:
            return now > self.deadline
        return self.state in (S.RESENDING, S.WAITING) and now >= self.resend_at

    def _current(self, event: Event) -> bool:
        """The one rule: outcomes of a send that is not the current one act on nothing."""
        match event:
            case flow.StageReplied(send, stage) | flow.StageFailed(send, stage):
                return send == self.send and self.stage <= stage < len(self.route.stages)
            case flow.NodeDown(node_id):
                pending = self.route.stages[self.stage :] if self.options.chain else ()
                return node_id in {s.node_id for s in pending} or (
                    self.route.stages[self.stage].node_id == node_id
                )
            case flow.Tick(now) if self.state is S.SENT:
                return now > self.deadline
        return True

    def _ignored(self, event: Event) -> None:
        if isinstance(event, flow.StageReplied):
            self.counters["late_replies"] += 1
        elif isinstance(event, flow.StageFailed):
            self.counters["stale_failures"] += 1

    # -- stages -----------------------------------------------------------------------

    def _dispatch(self, now: float, out: list[Action]) -> None:
        route, i = self.route, self.stage
        chained = len(route.stages) - 1 - i if self.options.chain else 0
        self.send = self.sends = self.sends + 1
        self.step_at = now if i == 0 else self.step_at
        self.sent_at = now
        self.deadline = now + self.options.stage_timeout_s * (1 + chained)
        self._to(S.SENT)
        kind = self.kinds.get(route.model_id) or self.routes.executor_kind(route.model_id)
        self.kinds[route.model_id] = kind  # a flight keeps the kind it started with
        if kind != "steps" and (what := unsupported(self.request)) is not None:
            self._error("bad_request", f"{route.model_id} cannot {what}", out)
            return
        o, layers = self.options, self.routes.layers(route.model_id)
        d = Dispatch(route, i, chained, layers, self.routes.epoch, o.prefix_cache, o.run_ahead)
        act = self.acts.get(route.stages[i].layer_start, b"")
        request = stage_request(kind, d, self.request, self.request_id, act, self.session, self.gen)
        out.append(Send(self.send, i, route.stages[i].node_id, request, chained))

    def _replied(self, ev: flow.StageReplied, out: list[Action]) -> None:
        at, reply, stages = ev.stage, ev.reply, self.route.stages
        self.stage, self.send = at, 0
        self.excused_since = None  # the link carried an answer: any excuse starts afresh
        node_id = stages[at].node_id
        if isinstance(reply, ErrorReply):
            if reply.error.code == "prefix_lost" and self.gen.reuse:
                return losses.prefix_lost(self, ev.now, out)
            why = classify(reply.error)
            if isinstance(why, GiveUp):
                return self._give_up(why, out)
            return losses.failed(self, node_id, why, ev.now, out)
        last = at == len(stages) - 1
        for s in stages[: at + 1] if last and self.options.chain else (stages[at],):
            self._report(Report(s.node_id, ok=True), out)
        if not isinstance(reply, OutputReply) and self.gen.heard(reply, first=at == 0):
            self.counters["prefix_reused"] += 1
        if not isinstance(reply, TokenReply) and reply.prompt_count is not None:
            self.prompt_count = reply.prompt_count
        if not last:
            act = reply.activation if isinstance(reply, ActivationReply) else b""
            self.acts[stages[at].layer_end] = act
            self.stage += 1
            return self._dispatch(ev.now, out)
        if isinstance(reply, TokenReply):
            return self._generated(reply, ev.send, ev.now, out)
        if not self.gen.started and self.attempts == 1 and not self.resent:  # one pass
            out.append(Sample(self.route.pipeline_id, ev.now - self.started, ev.now))
        output = ""
        if isinstance(reply, OutputReply):
            output, self.completion_count = reply.output, reply.completion_count
        return self._answer(True, output, None, out)

    def _generated(self, reply: TokenReply, send: int, now: float, out: list[Action]) -> None:
        """The last stage sampled a token: stream it, then the next step or the end."""
        step = self.gen.step(reply, self.request.max_tokens, self.request.stop, now)
        if step.positions == 1 and self.attempts == 1 and not self.resent:  # a decode step
            out.append(Sample(self.route.pipeline_id, now - self.step_at, now))
        if step.kind == "chunk":
            self.counters["prefill_chunks"] += 1
            if reply.more:  # run ahead, the rest follows: the send waits anew from here
                self.send, self.stage, self.acts = send, 0, {0: b""}
                self.deadline, self.sent_at = self.deadline + now - self.sent_at, now
                return self._to(S.SENT)
        if step.streamed is not None and self.request.stream:
            out.append(Stream(step.streamed.message(self.request_id)))
        if step.kind == "done":
            return self._answer(True, self.gen.so_far() or "", None, out)
        self.stage, self.acts = 0, {0: b""}
        return self._dispatch(now, out)

    def _report(self, report: Report, out: list[Action]) -> None:
        self.probes.discard(report.node_id)  # a probe we carried is delivered with it
        out.append(report)

    # -- answers ----------------------------------------------------------------------

    def _error(
        self, code: ErrorCode, message: str, out: list[Action], retry_after_s: float | None = None
    ) -> None:
        self.counters[f"error_{code}"] += 1
        body = ErrorBody(code=code, message=message, retry_after_s=retry_after_s)
        self._answer(False, self.gen.so_far(), body, out)

    def _give_up(self, why: GiveUp, out: list[Action]) -> None:
        self._error(why.code, why.message, out, why.retry_after_s)

    def _answer(
        self, ok: bool, output: str | None, error: ErrorBody | None, out: list[Action]
    ) -> None:
        self._to(S.DONE)
        self.send = 0
        self.routes.give_back(self.probes)
        self.probes = set()
        if ok:
            self.counters["answered"] += 1
            if self.degraded:
                self.counters["degraded"] += 1
        gen = self.gen
        # What the answer cost: a generation's tokens (its end token is not text, nor
        # counted), or a layer network's own count, if it keeps one.
        read = len(gen.prompt_tokens) if gen.prompt_tokens is not None else self.prompt_count
        written = gen.completion_tokens() if gen.started else self.completion_count
        reply = InferReply(
            ok=ok,
            output=output,
            route=self.route,
            degraded=self.degraded,
            attempts=self.attempts,
            request_id=self.request_id,
            model_id=self.model_id,
            error=error,
            retry_after_s=error.retry_after_s if error is not None else None,
            prompt_tokens=read,
            completion_tokens=written,
            finish_reason=gen.finish_reason,
            logprobs=gen.logprobs if self.request.logprobs is not None else None,
        )
        out.append(Answer(reply, tuple(self.also_reply_to), self.route))
        if self.routes.keeps_sessions(self.route.model_id):
            out.append(Release(self.route, self.session))
