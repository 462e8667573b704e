"""Every request a router holds, from its arrival to its answer, as one pure machine:
:meth:`RouterDesk.handle` takes an event (:mod:`hecate_router.desk_flow`) and answers
with actions. No I/O, no clock, no tasks: the router process (service.py) turns what
it hears into events and carries the actions out; the tests drive the desk in memory.

The desk owns the flights (each a :class:`~hecate_router.lifecycle.Lifecycle`), the
line and each pipeline's limit (:class:`AdmissionDesk`), retries (:class:`RetryBook`),
quota waits (:class:`QuotaWait`), early cancels, where prefixes are kept
(:class:`PrefixIndex`) and each route's load, from a flight's start to its landing.
The swarm's state is the :class:`SwarmView`'s: the desk asks it for routes.

A request's way in, in order: its retries (:mod:`hecate_router.retries`: joined,
answered again, or claimed from another replica first); the tenant's quota, when
enforced; a cancel that came first; then a route, or a place in line while every
healthy pipeline is at its limit, or ``rate_limited`` with a Retry-After and a ticket.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import msgspec

from hecate.core import RoutingError, RoutingRequest
from hecate.core.errors import ErrorCode, Saturated
from hecate.wire.errors import as_code, error_headers
from hecate.wire.messages import Failover, InferRequest, QuotaRequest, RetryClaim
from hecate_router import desk_flow as d
from hecate_router import flow, retries
from hecate_router.admission import AdmissionDesk, is_line_ticket
from hecate_router.affinity import Outcome, PrefixIndex, fingerprints, routed
from hecate_router.config import RouterConfig
from hecate_router.hearing import Hearing
from hecate_router.lifecycle import Lifecycle
from hecate_router.quota import Admit, AskDesk, QuotaAction, QuotaWait, Refuse
from hecate_router.reconnect import ReconnectWindow
from hecate_router.retrybook import Ident, RetryBook
from hecate_router.swarmview import SwarmView

_json = msgspec.json.Encoder()
# What a flight is fed here: every flight event but a joined retry's, each with its time.
Timed = (
    flow.Start
    | flow.StageReplied
    | flow.StageFailed
    | flow.NodeDown
    | flow.Tick
    | flow.Cancelled
    | flow.Abort
)


@dataclass(slots=True, eq=False)
class Admission:
    """A request on its way in: waiting for its claim, the quota desk, or room."""

    call: int
    request_id: str
    model_id: str
    request: InferRequest
    reply_to: str
    quota: QuotaWait | None = None


@dataclass(slots=True, eq=False)
class Flight:
    machine: Lifecycle
    ident: Ident | None  # (tenant, client request_id), for idempotent retries
    joined: list[int] = field(default_factory=list)  # calls of retries that reached us
    prints: list[tuple[bytes, float]] = field(default_factory=list)  # its prompt's prefixes
    prefix: Outcome | None = None  # where it went as to the prefix kept (affinity.outcome)


class RouterDesk:
    def __init__(
        self,
        config: RouterConfig,
        view: SwarmView,
        *,
        flight_prefix: str,
        counters: Counter[str] | None = None,
    ) -> None:
        """``flight_prefix`` names this router's flights (and so the nodes' sessions)
        apart from every other replica's and from its own earlier runs."""
        self.config = config
        self.view = view
        self.options = config.flow()
        self.flight_prefix = flight_prefix
        self.counters: Counter[str] = Counter() if counters is None else counters
        self.flights: dict[int, Flight] = {}
        self.line: AdmissionDesk[Admission] = AdmissionDesk(
            limits=config.limits,
            queue_limit=config.queue_limit,
            max_wait_s=config.queue_timeout_s,
            max_line_wait_s=max(config.queue_max_wait_s, config.queue_timeout_s),
        )
        self.book: RetryBook[Admission] = RetryBook(
            remember=config.remember_answers, remember_bytes=config.remember_answer_bytes
        )
        self.quotas: dict[int, Admission] = {}  # waiting for the quota desk, by call
        self.cancels: OrderedDict[Ident, None] = OrderedDict()
        self.reconnect = ReconnectWindow()  # every flight's
        self.hearing = Hearing()  # every flight's: what came in over the link, and when
        # Where each tenant's prompt prefixes are kept, as the nodes say and as guessed.
        self.affinity = PrefixIndex()
        self.awake: float | None = None  # the last time the desk was told the time (retries.py)
        self.doubt_until = 0.0  # until then, first attempts are asked about first

    # -- the one entry point ------------------------------------------------------------

    def handle(self, ev: d.Event) -> list[d.Action]:
        out: list[d.Action] = []
        match ev:  # the most frequent first
            case d.StageHeard():
                self._stage(ev, out)
            case d.Arrived():
                self._arrived(ev, out)
            case d.Tick(now):
                self._tick(now, out)
            case d.QuotaAnswered(call, reply, now):
                self.hearing.heard(now)
                a = self.quotas.get(call)
                if a is not None and a.quota is not None:
                    acts = a.quota.unreachable() if reply is None else a.quota.answered(reply, now)
                    self._quota(a, acts, now, out)
            case d.NodeDown(node_id, _, now):
                # Telemetry's verdict: a stage delivered to it will never be answered.
                self.reconnect.declared_down(node_id, now)
                self.affinity.kept.forget(node_id)
                self.hearing.heard(now)
                for key in list(self.flights):
                    self.feed_flight(key, ev, out)
            case d.Cancel(tenant, request_id, now):
                retries.cancel(self, (tenant, request_id), now, out)
            case d.Claimed(tenant, request_id, reply_to):
                if retries.repeat(self, (tenant, request_id), reply_to, out):
                    out.append(d.OwnRetry())
            case d.HandedOver(claim):
                a = self.book.owned(claim)
                if a is not None:
                    self.counters["retries_handed_over"] += 1
                    out.append(d.Forget(a.call))
            case d.Reconnected(at, now, wall):
                if at > self.reconnect.at:
                    snap = self.view.telemetry
                    alive = [n for n, t in snap.nodes.items() if t.alive] if snap else []
                    self.reconnect.reconnected(at, alive)
                    if snap is not None:
                        self.reconnect.read(snap, now, wall, self.options.reconnect_grace_s)
            case d.TelemetryHeard(snapshot, now, wall):
                self.hearing.heard(now)
                self.reconnect.read(snapshot, now, wall, self.options.reconnect_grace_s)
            case d.Drain():
                for a in list(self.line.drain()):
                    self._reject(a, "draining", "router stopped before the request found room", out)
            case d.Stop(now):
                stopped = flow.Abort("draining", "router stopped before the answer", now)
                for key in list(self.flights):
                    self.feed_flight(key, stopped, out)
        return out

    def request_id(self, call: int, request: InferRequest) -> str:
        """The caller's id for its request, or this router's for one that has none."""
        return request.request_id or f"{self.config.instance_id}-{call}"

    def status(self) -> dict[str, object]:
        return {
            "in_flight": len(self.flights),
            "admission": self.line.status(),
            "counters": dict(self.counters),
        }

    # -- the way in ---------------------------------------------------------------------

    def _arrived(self, ev: d.Arrived, out: list[d.Action]) -> None:
        request = ev.request
        a = Admission(ev.call, self.request_id(ev.call, request), ev.model_id, request, ev.reply_to)
        if self.view.router is None:
            return self._reject(a, "no_plan", "no plan yet: the planner has not published one", out)
        if request.request_id:
            ident = (request.tenant, request.request_id)
            if retries.repeat(self, ident, ev.call, out):
                return None
            if (request.attempt > 1 or retries.doubted(self, ev.now)) and ev.reply_to:
                # A retry (or a request that waited out a freeze of this replica) that
                # may belong to another replica: find it before running it.
                n = self.book.claim(a, ev.now)
                claim = RetryClaim(tenant=ident[0], request_id=ident[1], reply_to=ev.reply_to)
                out.append(d.AskOwner(n, claim))
                return None
        return self._admit(a, ev.now, out)

    def _admit(self, a: Admission, now: float, out: list[d.Action]) -> None:
        """A new request: the quota desk, when quotas are enforced, or a route."""
        if not self.config.enforce_quotas:
            return self._start(a, now, out)
        ticket = a.request.quota_ticket
        a.quota = QuotaWait(
            tenant=a.request.tenant,
            max_wait_ms=a.request.max_wait_ms,
            timeout_s=self.config.quota_timeout_s,
            counters=self.counters,
            # A line ticket is the router's own, not the quota desk's: the request asks
            # the quota desk as a new one.
            ticket=None if is_line_ticket(ticket) else ticket,
        )
        self.quotas[a.call] = a
        return self._quota(a, a.quota.start(now), now, out)

    def _quota(
        self, a: Admission, acts: list[QuotaAction], now: float, out: list[d.Action]
    ) -> None:
        for act in acts:
            match act:
                case AskDesk(ticket):
                    ask = QuotaRequest(
                        tenant=a.request.tenant, tokens=a.request.max_tokens, ticket=ticket
                    )
                    out.append(d.AskQuota(a.call, ask))
                case Admit():
                    del self.quotas[a.call]
                    self._start(a, now, out)
                case Refuse(message, wait, ticket):
                    del self.quotas[a.call]
                    self._reject(a, "rate_limited", message, out, wait, ticket=ticket)

    def _start(self, a: Admission, now: float, out: list[d.Action]) -> None:
        """Admitted: choose a route and send the first stage; or, when every healthy
        pipeline is at its limit, wait in line for room."""
        request = a.request
        ident = (request.tenant, request.request_id) if request.request_id else None
        if ident is not None and self.cancels and ident in self.cancels:
            self.counters["cancelled"] += 1
            return self._reject(a, "cancelled", "the caller cancelled the request", out)
        keeps = self.options.prefix_cache and self.view.keeps_sessions(a.model_id)
        prints = fingerprints(request) if keeps else []  # once a flight: kept for its end
        firsts, layers = self.view.firsts(a.model_id), self.view.layers(a.model_id)
        cached, saves = self.affinity.where(prints, a.model_id, firsts, layers)
        full = self.line.full()
        try:
            route, degraded, probes = self.view.choose(
                a.model_id,
                RoutingRequest(tokens=request.max_tokens, cached=cached, saves=saves),
                full,
            )
        except Saturated:
            if self.line.wait(a.model_id, request.tenant, a, now, ticket=request.quota_ticket):
                self.counters["queued"] += 1
                return None
            return self._refuse_busy(a, "the line for room is full", since=now, now=now, out=out)
        except RoutingError as exc:
            return self._reject(a, exc.code, exc.message, out)
        router = self.view.router
        assert router is not None  # choose raised no_plan otherwise
        router.begin(route)
        went = routed(self.counters, cached, route.pipeline_id, full) if prints else None
        self.line.began(route.pipeline_id, a.model_id)
        machine = Lifecycle(
            request=request,
            request_id=a.request_id,
            model_id=a.model_id,
            route=route,
            routes=self.view,
            options=self.options,
            counters=self.counters,
            degraded=degraded,
            probes=probes,
            reconnect=self.reconnect,
            hearing=self.hearing,
            flight_id=f"{self.flight_prefix}{a.call}",
        )
        if ident is not None:
            self.book.started(ident, a.call)
        self.flights[a.call] = Flight(machine, ident, prints=prints, prefix=went)
        return self.feed_flight(a.call, flow.Start(now), out)

    def _refuse_busy(
        self, a: Admission, why: str, *, since: float, now: float, out: list[d.Action]
    ) -> None:
        """Overload's honest answer: not now, when to come back, and a line ticket that
        keeps the place it held (it first asked at ``since``) for a caller back by then."""
        retry = self.line.retry_after_s(a.model_id)
        ticket = self.line.ticket(a.model_id, a.request.tenant, since, retry, now)
        self.counters["rate_limited_load"] += 1
        busy = f"every healthy pipeline of {a.model_id!r} is busy and {why}"
        message = f"{busy}; retry in {retry:.1f} s with quota_ticket {ticket} to keep its place"
        self._reject(a, "rate_limited", message, out, retry, ticket=ticket)

    def _admit_waiting(self, model_id: str, now: float, out: list[d.Action]) -> None:
        """Room may have opened on ``model_id``: start who is next in line, in turn per
        tenant, while some pipeline has room."""
        if not self.line.waiting(model_id):
            return  # the common case, on every answer: nobody in line
        while self.view.router is not None and not self.view.saturated(model_id, self.line.full()):
            a = self.line.next(model_id)
            if a is None:
                return
            self._start(a, now, out)

    @staticmethod
    def _reject(
        a: Admission,
        code: ErrorCode,
        message: str,
        out: list[d.Action],
        retry_after_s: float | None = None,
        *,
        ticket: int | None = None,
    ) -> None:
        refusal = d.refusal(a.model_id, a.request_id, code, message, retry_after_s, ticket)
        out.append(d.Respond((a.call,), refusal))

    # -- flights ------------------------------------------------------------------------

    def _stage(self, ev: d.StageHeard, out: list[d.Action]) -> None:
        self.hearing.heard(ev.now)  # anything at all: the router's link carries
        flight = self.flights.get(ev.flight)
        if flight is None:  # an outcome for a flight already answered
            failed = isinstance(ev.outcome, flow.Failure)
            self.counters["stale_failures" if failed else "late_replies"] += 1
            return None
        if isinstance(ev.outcome, flow.Failure):
            return self.feed_flight(
                ev.flight, flow.StageFailed(ev.send, ev.stage, ev.outcome, ev.now), out
            )
        m = flight.machine
        answerer = ev.answerer(m.send, m.route.stages)  # before it moves on
        self.feed_flight(ev.flight, flow.StageReplied(ev.send, ev.stage, ev.outcome, ev.now), out)
        if answerer is not None:  # after the feed has opened any new window
            self.reconnect.replied(answerer, ev.now)
        return None

    def _tick(self, now: float, out: list[d.Action]) -> None:
        """Stage deadlines, held quota waits, unowned claims, the line."""
        retries.clock(self, now)
        for a in list(self.quotas.values()):
            if a.quota is not None:
                self._quota(a, a.quota.tick(now), now, out)
        if self.book.pending:
            for a in self.book.unclaimed(now):
                self._admit(a, now, out)
        for _model_id, waited, since in list(self.line.expired(now)):
            why = f"it waited {now - since:.1f} s in line, all the line allowed"
            self._refuse_busy(waited, why, since=since, now=now, out=out)
        for model_id in self.line.models_waiting():
            self._admit_waiting(model_id, now, out)  # pipelines may have come back
        for key in [k for k, f in self.flights.items() if f.machine.due(now)]:
            self.feed_flight(key, flow.Tick(now), out)

    def feed_flight(self, key: int, ev: Timed, out: list[d.Action]) -> None:
        flight = self.flights.get(key)
        if flight is None:
            return
        for act in flight.machine.handle(ev):
            match act:
                case flow.Send():
                    out.append(d.Dispatch(key, flight.machine.attempts, act))
                case flow.Stream(token):
                    out.append(d.Streamed(key, token))
                case flow.Suspect(node_id):
                    self.view.suspect(node_id)
                case Failover():
                    out.append(d.FailedOver(key, act))
                case flow.Move(old, new):
                    router = self.view.router
                    assert router is not None
                    router.end(old)
                    self.line.moved(old.pipeline_id, new.pipeline_id)
                    router.begin(new)
                case flow.Sample(pipeline_id, seconds, now):
                    self.line.sample(pipeline_id, seconds, now)
                    self.view.measured(pipeline_id, seconds)
                case flow.Answer():
                    self._landed(key, flight, act, ev.now, out)
                case flow.Report() | flow.Release():
                    out.append(act)

    def _landed(
        self, key: int, flight: Flight, a: flow.Answer, now: float, out: list[d.Action]
    ) -> None:
        """A flight answered: every caller of it hears, its route's load ends, the
        answer is remembered for retries, and its place may go to the line."""
        del self.flights[key]
        m, reply, err = flight.machine, a.reply, a.reply.error
        reply = msgspec.structs.replace(reply, prefix=flight.prefix) if flight.prefix else reply
        body = _json.encode(reply)
        headers = error_headers(as_code(err.code), err.message, err.retry_after_s) if err else None
        out.append(d.Respond((key, *flight.joined), reply, body, headers, to=a.also))
        if self.view.router is not None:
            self.view.router.end(m.route)
        read, first = m.gen.prompt_tokens, m.gen.first_token_at
        if reply.ok and read and flight.prints and not m.degraded:
            self.affinity.served(flight.prints, m.route.pipeline_id, len(read))
            if flight.prefix == "none" and first is not None and m.attempts == 1:
                self.affinity.prefilled(m.route.pipeline_id, len(read), first - m.started)
        self.line.ended(m.route.pipeline_id, m.model_id, now - m.started)
        if flight.ident is not None:
            self.book.finished(flight.ident, (body, headers))
        self._admit_waiting(m.model_id, now, out)
