"""Where the router's flights live, and the one place their actions meet the bus.

A :class:`Flight` is a request's :class:`Lifecycle` (the pure machine that decides) with
what only the shell holds: the caller's deferred :class:`Request` handle, the retries
that joined it, and the span of the stage in flight. :meth:`FlightDeck.feed` gives the
machine an event and carries out what it answers; :meth:`FlightDeck.on_inbox` turns the
router's inbox (stage replies, NATS' no-responders status) into events. It also keeps
the router's :class:`ReconnectWindow` fed with what says a node is back after the
router's reconnect: the stage replies it reads, and telemetry's heartbeats and verdicts;
and the router's :class:`Hearing` with every sign that its own link carries anything (an
inbox message, a telemetry snapshot, a node-down verdict), so that a stage lost with
the router's link is not taken for the node's fault.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context

from hecate.bus import tracing
from hecate.bus.logs import event
from hecate.bus.service import NO_RESPONDERS, Request, Service, error_headers
from hecate.core import Route
from hecate.wire import subjects
from hecate.wire.errors import as_code
from hecate.wire.messages import (
    STREAM_TOKEN_HEADERS,
    ErrorReply,
    Failover,
    FailoverEvent,
    InferRequest,
    SessionRelease,
)
from hecate.wire.stages import StageReply, reply_decoder
from hecate_router.admission import AdmissionDesk
from hecate_router.flow import (
    Action,
    Answer,
    Event,
    Failure,
    FlowOptions,
    Move,
    NodeDown,
    Release,
    Report,
    Sample,
    Send,
    StageFailed,
    StageReplied,
    Start,
    Stream,
    Suspect,
    Tick,
)
from hecate_router.hearing import Hearing
from hecate_router.lifecycle import Lifecycle
from hecate_router.quotagate import Admission, QuotaGate
from hecate_router.reconnect import ReconnectWindow
from hecate_router.retries import RetryLedger
from hecate_router.swarmview import SwarmView

_stage_reply = reply_decoder()
# Refusals come from the service shell, untagged, like every subject's error replies.
_error_reply = msgspec.msgpack.Decoder(ErrorReply)
_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


@dataclass(slots=True, eq=False)
class Flight:
    key: int
    machine: Lifecycle
    handle: Request[InferRequest]
    ident: tuple[str, str] | None  # (tenant, client request_id), for idempotent retries
    joined: list[Request[InferRequest]] = field(default_factory=list)  # retries seen here
    stage_span: Span | None = None
    answer: tuple[bytes, dict[str, str] | None] = (b"", None)


async def _nothing(_flight: Flight) -> None:
    return None


def parse_token(token: str) -> tuple[int, int, int] | None:
    """``<flight>-<send>-<stage>``, the last token of a stage reply's subject."""
    parts = token.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def _read_reply(data: bytes) -> StageReply | ErrorReply | str:
    """A stage's answer or refusal, or why it could not be read."""
    try:
        return _stage_reply.decode(data)
    except msgspec.DecodeError as exc:
        try:
            return _error_reply.decode(data)
        except msgspec.DecodeError:
            return str(exc)


class FlightDeck:
    def __init__(
        self,
        service: Service,
        view: SwarmView,
        admission: AdmissionDesk[Admission],
        options: FlowOptions,
        counters: Counter[str],
    ) -> None:
        self.service = service
        self.view = view
        self.admission = admission
        self.options = options
        self.counters = counters
        self.flights: dict[int, Flight] = {}
        # Names this router's flights (and so the nodes' sessions) apart from every
        # other replica's and from its own earlier runs, which count keys from 1 too.
        self.flight_prefix = f"{service.instance_id}-{secrets.token_hex(6)}-"
        self.inbox = ""
        self.reconnect = ReconnectWindow()  # every flight's, fed by _observe
        self.hearing = Hearing(time.monotonic())  # every flight's: what came in, and when
        self._snapshot: object = None  # the telemetry snapshot last read into it
        self.on_landed: Callable[[Flight], Awaitable[None]] = _nothing

    async def launch(self, a: Admission, route: Route, degraded: bool, probes: set[str]) -> None:
        request = a.handle.body
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
            flight_id=f"{self.flight_prefix}{a.key}",
        )
        ident = (request.tenant, request.request_id) if request.request_id else None
        flight = Flight(a.key, machine, a.handle, ident)
        self.flights[a.key] = flight
        await self.feed(flight, Start(time.monotonic()))

    async def feed(self, flight: Flight, ev: Event) -> None:
        # The bus may have come back since the flight started: "no responders" right
        # after can mean "not resubscribed yet" (the window says for how long).
        self._observe(time.monotonic())
        if isinstance(ev, NodeDown):  # telemetry's verdict, for the flights resending too
            self.reconnect.declared_down(ev.node_id, ev.now)
            self.hearing.heard(ev.now)
        elif isinstance(ev, Tick) and self.view.telemetry_heard:
            # A deadline is judged on what the router heard: telemetry's latest snapshot
            # came in over its link when the watch delivered it.
            self.hearing.heard(self.view.telemetry_heard)
        for action in flight.machine.handle(ev):
            await self._act(flight, action)

    async def on_inbox(self, msg: Msg, *, quotas: QuotaGate, retries: RetryLedger) -> None:
        now = time.monotonic()
        self.hearing.heard(now)  # anything at all: the router's link carries
        token = msg.subject.rsplit(".", 1)[-1]
        if token[:1] == "q" and token[1:].isdigit():
            return await quotas.on_reply(int(token[1:]), msg)
        if token[:1] == "r" and token[1:].isdigit():
            return retries.handed_over(int(token[1:]))  # its owner answered the client
        ids = parse_token(token)
        flight = self.flights.get(ids[0]) if ids is not None else None
        if ids is None or flight is None:
            self.counters["late_replies"] += 1  # an answer to a flight already answered
            return None
        _key, send, stage = ids
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            failure = Failure("no_responders", "no responders")
            return await self.feed(flight, StageFailed(send, stage, failure, now))
        reply = _read_reply(msg.data)
        if isinstance(reply, str):
            failure = Failure("unreadable", f"unreadable reply: {reply}")
            return await self.feed(flight, StageFailed(send, stage, failure, now))
        answered = self._answerer(flight.machine, send, stage, reply)  # before it moves on
        await self.feed(flight, StageReplied(send, stage, reply, now))
        if answered is not None:  # after feed has opened any new window
            self.reconnect.replied(answered, now)
        return None

    # -- what says a node is back after a reconnect -------------------------------------

    def _observe(self, now: float) -> None:
        """Open the window on the router's reconnect, then read telemetry into it while
        it is open: a heartbeat after the reconnect went through the server as it is
        now, and a node declared down since is not waited for. Telemetry's times are
        its wall clock, compared with ours: hosts are assumed to keep NTP time."""
        window = self.reconnect
        back = self.service.reconnected_at
        if back and back > window.at:  # reopen it on a reconnect it has not seen
            snap = self.view.telemetry
            alive = [n for n, t in snap.nodes.items() if t.alive] if snap else []
            window.reconnected(back, alive)
            self._snapshot = None
        if now - window.at >= self.options.reconnect_grace_s:
            return  # steady state: the window closed and no reconnect since
        snap = self.view.telemetry
        if snap is None or snap is self._snapshot:
            return
        self._snapshot = snap
        wall_now = time.time()
        wall_back = wall_now - (now - window.at)
        if snap.written_at <= wall_back:
            return  # written before we were back: says nothing of the server as it is
        for node_id, t in snap.nodes.items():
            if not t.alive:
                window.declared_down(node_id, now)
            elif t.last_seen is not None and t.last_seen > wall_back:
                window.heard_from(node_id, now - (wall_now - t.last_seen))

    @staticmethod
    def _answerer(
        machine: Lifecycle, send: int, stage: int, reply: StageReply | ErrorReply
    ) -> str | None:
        """The node a reply on the current send's stage subject comes from: that stage's,
        except for a no-responders a chained node relays for the next one."""
        if isinstance(reply, ErrorReply) and reply.error.code == "no_responders":
            return None
        if send == machine.send and stage < len(machine.route.stages):
            return machine.route.stages[stage].node_id
        return None

    # -- actions ----------------------------------------------------------------------

    async def _act(self, flight: Flight, action: Action) -> None:
        match action:
            case Send():
                await self._send(flight, action)
            case Stream(token):
                # On the caller's own reply path (nowhere else), from the connection the
                # answer leaves by, so the tokens arrive before it.
                if flight.handle.reply:
                    await self.service.nc.publish(
                        flight.handle.reply, _json.encode(token), headers=STREAM_TOKEN_HEADERS
                    )
            case Report(node_id, ok, code, retry_after_s):
                if self.view.breakers is not None:
                    await self.view.breakers.report(
                        node_id, ok=ok, code=code, retry_after_s=retry_after_s
                    )
            case Suspect(node_id):
                self.view.suspect(node_id)
            case Failover():
                await self._failover(flight, action)
            case Move(old, new):
                assert self.view.router is not None
                self.view.router.end(old)
                self.admission.moved(old.pipeline_id, new.pipeline_id)
                self.view.router.begin(new)
            case Release(route, session):
                await self._release(route, session)
            case Sample(pipeline_id, seconds, now):
                self.admission.sample(pipeline_id, seconds, now)
                self.view.measured(pipeline_id, seconds)
            case Answer():
                await self._answer(flight, action)

    async def _send(self, flight: Flight, s: Send) -> None:
        base = f"{self.inbox}.{flight.key}-{s.send}"
        request = msgspec.structs.replace(s.request, reply_base=base) if s.chained else s.request
        headers = None
        if self.service.tracing:
            self._end_stage_span(flight)
            flight.stage_span = self.service.tracer.start_span(
                f"stage {s.node_id}",
                context=set_span_in_context(flight.handle.span),
                kind=SpanKind.CLIENT,
                attributes={
                    "hecate.node": s.node_id,
                    "hecate.layers": f"{request.layer_start}-{request.layer_end}",
                    "hecate.attempt": flight.machine.attempts,
                    "hecate.chained_stages": s.chained,
                },
            )
            headers = tracing.inject({}, set_span_in_context(flight.stage_span))
        body = _msgpack.encode(request)
        failure: Failure | None = None
        try:
            await self.service.nc.publish(
                subjects.node_run(s.node_id), body, reply=f"{base}-{s.stage}", headers=headers
            )
        except MaxPayloadError:  # the request outgrew the bus: nobody failed
            failure = Failure(
                "too_large",
                f"stage {s.stage} of the route needs {len(body):,} bytes, over the bus's "
                f"max_payload of {self.service.nc.max_payload:,}: the prompt is too long "
                "for this swarm",
            )
        except Exception as exc:  # disconnected: fail over like any stage failure
            failure = Failure("publish_failed", f"publish failed: {exc!r}")
        if failure is not None:
            await self.feed(flight, StageFailed(s.send, s.stage, failure, time.monotonic()))

    async def _failover(self, flight: Flight, f: Failover) -> None:
        if flight.stage_span is not None:
            flight.stage_span.set_status(Status(StatusCode.ERROR, f.reason))
        self._end_stage_span(flight)
        flight.handle.span.add_event(
            "failover",
            {"hecate.lost_node": f.lost_node, "hecate.kind": f.kind, "hecate.reason": f.reason},
        )
        failover = FailoverEvent(
            **msgspec.structs.asdict(f), router_id=self.service.instance_id, at=time.time()
        )
        await self.service.nc.publish(subjects.EVENT_FAILOVER, _json.encode(failover))
        event(
            self.service.log,
            "failover",
            request_id=f.request_id,
            lost_node=f.lost_node,
            kind=f.kind,
            reason=f.reason,
            attempt=f.attempt,
        )

    async def _answer(self, flight: Flight, a: Answer) -> None:
        del self.flights[flight.key]
        self._end_stage_span(flight)
        reply, err = a.reply, a.reply.error
        body = _json.encode(reply)
        headers = error_headers(as_code(err.code), err.message, err.retry_after_s) if err else None
        flight.answer = (body, headers)
        if reply.degraded:
            flight.handle.span.set_attribute("hecate.degraded", True)
        for handle in (flight.handle, *flight.joined):
            if err is None:
                await handle.respond(body)
            else:
                handle.span.set_status(Status(StatusCode.ERROR, err.code))
                code = as_code(err.code)
                await handle.error(code, err.message, retry_after_s=err.retry_after_s, body=reply)
        for reply_to in a.also:
            await self.service.nc.publish(reply_to, body, headers=headers)
        await self.on_landed(flight)

    async def _release(self, route: Route, session: str) -> None:
        """Tell the route's nodes that ``session`` is over: they drop its caches now,
        not when they idle out, and refuse any step of it still on its way."""
        body = _json.encode(SessionRelease(session=session))
        for node_id in dict.fromkeys(s.node_id for s in route.stages):
            try:
                await self.service.nc.publish(subjects.node_release(node_id), body)
            except Exception as exc:  # disconnected: the caches idle out instead
                event(self.service.log, "release not sent", logging.DEBUG, error=repr(exc))
                return
        self.counters["sessions_released"] += 1

    @staticmethod
    def _end_stage_span(flight: Flight) -> None:
        if flight.stage_span is not None:
            flight.stage_span.end()
            flight.stage_span = None
