"""router: ``hecate.infer.<model>`` in, an answer or an explicit error out. Always.

Listens: ``hecate.infer.>`` in queue group ``hecate-routers`` (any number of replicas),
and its own reply inbox for stage replies.
Holds: a :class:`SwarmView` (swarmview.py): the latest plan and telemetry snapshots,
the shared circuit breakers and its own suspicions, folded into a core
:class:`SwarmState` and a core :class:`Router` that counts this replica's in-flight work.
Admits: per pipeline only as many requests as its measured step times allow; the rest
wait in a per-tenant line, then get ``rate_limited`` with a Retry-After (admission.py).
Calls: ``Router.route`` to choose a pipeline, ``failover_in_swarm`` when a stage fails
(both through the SwarmView, which spends a probe lease on whichever route takes it).
Publishes: stage requests on ``hecate.node.<id>.run`` (it calls each stage in turn and
keeps the activation between stages), ``hecate.events.failover``, and the reply.

No task or future per request: a request is a :class:`Flight` in a table keyed by a
counter; stage replies arrive on one subscription and are correlated by the last token
of their reply subject; a sweep expires stages that outlive their timeout. A stage sent
to a dead node is refused by NATS' no-responders status (a 503 on the reply subject,
within a millisecond or two); one the node held when it died gets no status and waits
for telemetry's node-down event (0.3-0.4 s) or the timeout; an error reply counts too.
Then the flight fails over: the
rescue route resumes from the last layer boundary whose activation the router holds,
so work already done on live nodes is not redone.

Those outcomes race (the reply, the node-down event and the sweep's timeout of the same
stage come by different paths), so every one of them goes through one rule,
:func:`flights.claim`: the first outcome of a send takes it and the others find
nothing to act on; and a flight is answered only by whoever lands it. A flight that has
answered is never failed over, and no caller gets two answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from typing import Literal

import msgspec
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from opentelemetry.trace import (
    INVALID_SPAN,
    SpanKind,
    Status,
    StatusCode,
    TracerProvider,
    set_span_in_context,
)

from hecate.bus import tracing
from hecate.bus.logs import event
from hecate.bus.service import NO_RESPONDERS, Service, error_headers
from hecate.core import (
    FailoverOptions,
    Recovered,
    Route,
    RoutingError,
    RoutingRequest,
)
from hecate.core.admission import LimitOptions
from hecate.core.errors import Saturated
from hecate.services.admission import AdmissionDesk
from hecate.services.breakers import BreakerView
from hecate.services.flights import Flight, claim, expired, land, live, waiting_on
from hecate.services.quotagate import Admission, QuotaGate
from hecate.services.retries import RetryLedger
from hecate.services.swarmview import SwarmView
from hecate.wire import subjects
from hecate.wire.errors import ErrorCode, as_code
from hecate.wire.messages import (
    ErrorBody,
    FailoverEvent,
    InferCancel,
    InferReply,
    InferRequest,
    NodeEvent,
    SessionRelease,
    StageReply,
    StageRequest,
    StreamToken,
)

_infer = msgspec.json.Decoder(InferRequest)
_cancel = msgspec.json.Decoder(InferCancel)
_node_event = msgspec.json.Decoder(NodeEvent)
_stage_reply = msgspec.msgpack.Decoder(StageReply)
_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()

# Stage errors that are the request's own doing: no node failed, and no other route would
# do better, so the caller gets the error itself rather than a failover that ends in
# "node lost".
REQUEST_FAULTS: frozenset[ErrorCode] = frozenset(
    {"payload_too_large", "prompt_too_long", "bad_request"}
)
# How often the sweep runs: stage timeouts, held quota admissions, probe leases due.
SWEEP_S = 0.02
# Cancels of requests not (yet) in flight here, remembered so that one still waiting for
# its quota or a place in line is answered ``cancelled`` instead of being run.
REMEMBER_CANCELS = 4096


class RouterService:
    def __init__(
        self,
        *,
        instance_id: str,
        failover: FailoverOptions = FailoverOptions(),  # noqa: B008 (frozen)
        max_attempts: int = 3,
        max_replays: int = 2,
        stage_timeout_s: float = 2.0,
        suspect_s: float = 2.0,
        stale_s: float = 2.0,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
        max_request_bytes: int = 256 * 1024,
        dispatch: Literal["hop", "chain"] = "hop",
        breaker_probe_timeout_s: float = 10.0,
        enforce_quotas: bool = False,
        quota_timeout_s: float = 1.0,
        remember_answers: int = 10_000,
        limits: LimitOptions = LimitOptions(),  # noqa: B008 (frozen)
        queue_limit: int = 1024,
        queue_timeout_s: float = 5.0,
    ) -> None:
        self.instance_id = instance_id
        self.failover = failover
        self.max_attempts = max_attempts
        self.max_replays = max_replays
        self.reconnect_grace_s = 3.0
        self.stage_timeout_s = stage_timeout_s
        self.log = log
        self.max_request_bytes = max_request_bytes
        self.dispatch_mode = dispatch
        self.breaker_probe_timeout_s = breaker_probe_timeout_s
        self.enforce_quotas = enforce_quotas
        self.service = Service(
            kind="router",
            name=subjects.SERVICE_NAMES["router"],
            instance_id=instance_id,
            description="routes hecate.infer.<model> along the cheapest healthy pipeline",
            log=log,
            tracer_provider=tracer_provider,
        )
        self.tracer = self.service.tracer
        self.tracing = self.service.tracing
        self.flights: dict[int, Flight] = {}
        self.cancels: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._next = 0
        self.view = SwarmView(failover=failover, suspect_s=suspect_s, stale_s=stale_s, log=log)
        self.counters: Counter[str] = Counter()
        self.retries = RetryLedger(
            self.service,
            router_id=instance_id,
            counters=self.counters,
            join=self._join,
            admit=self._admit_again,
            remember=remember_answers,
        )
        self.quotas = QuotaGate(
            self.service, start=self._start, counters=self.counters, timeout_s=quota_timeout_s
        )
        # Requests in flight per pipeline, bounded by what each pipeline measurably
        # serves; the rest wait in line per tenant, then are refused as rate_limited.
        self.admission: AdmissionDesk[Admission] = AdmissionDesk(
            limits=limits, queue_limit=queue_limit, max_wait_s=queue_timeout_s
        )

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, url: str, stop: asyncio.Event, grace: float = 10.0) -> None:
        svc = self.service
        await svc.start(url)
        # Under the connection's inbox prefix (``_INBOX.<user>`` with credentials), the
        # only inboxes the NATS permissions let nodes and the breaker service answer.
        self.inbox = f"{svc.nc.new_inbox()}.{self.instance_id}"
        self.quotas.inbox = self.retries.inbox = self.inbox
        await svc.nc.subscribe(f"{self.inbox}.*", cb=self._on_stage_reply)
        view = self.view
        view.breakers = BreakerView(
            svc.nc,
            router_id=self.instance_id,
            probe_timeout_s=self.breaker_probe_timeout_s,
            log=self.log,
            on_change=view.rebuild,
            counters=self.counters,
            reconnect_grace_s=self.reconnect_grace_s,
        )
        # Each bucket's owner creates it; the router follows whatever exists, and the
        # rest as soon as it appears (it serves nothing without a plan anyway).
        svc.spawn(view.follow_plan(svc.nc))
        svc.spawn(view.follow_telemetry(svc.nc))
        svc.spawn(view.breakers.follow())
        svc.spawn(self._sweep())
        await svc.add_raw("retries", subjects.ROUTER_RETRIES, self.retries.on_claim)
        await svc.add_raw("node-down", subjects.EVENT_NODE_DOWN, self._on_node_down)
        await svc.add_raw("cancel", subjects.ROUTER_CANCEL, self._on_cancel)
        self.stats = await svc.add_raw(
            "infer", subjects.INFER_ALL, self._on_infer, queue=subjects.ROUTER_QUEUE
        )
        self.stats.status = self.status
        await svc.ready()
        await svc.nc.flush()
        event(self.log, "router ready", inbox=self.inbox)
        await stop.wait()
        # Drain: stop taking requests (inbound), let flights land, then close outbound.
        await svc.drain_inbound(grace)
        for waiting in list(self.admission.drain()):
            waiting.span.end()
            await self._reject(
                waiting.reply_to,
                "draining",
                "router stopped before the request found room",
                waiting.model_id,
                waiting.request_id,
            )
        deadline = time.monotonic() + grace
        while self.flights and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for flight in list(self.flights.values()):
            await self._finish_error(flight, "draining", "router stopped before the answer")
        if view.breakers is not None:
            if view.breakers.backlog and svc.nc.is_connected:
                await view.breakers.deliver()  # a last try for reports kept meanwhile
            view.breakers.close()
        await svc.stop(grace)

    # -- snapshots ---------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        breakers = self.view.breakers
        return {
            **self.view.freshness(),
            "in_flight": len(self.flights),
            "breakers_open": sorted(
                t
                for t, (snap, _) in (breakers.snapshots.items() if breakers else ())
                if snap.state != "closed"
            ),
            "probe_leases_won": breakers.leases_won if breakers else 0,
            "admission": self.admission.status(),
            "counters": dict(self.counters),
        }

    # -- requests ----------------------------------------------------------------------

    async def _on_infer(self, msg: Msg) -> None:
        self.stats.num_requests += 1
        reply_to = msg.reply or ""
        model_id = subjects.model_from_infer_subject(msg.subject)
        if model_id is None:
            return await self._reject(
                reply_to,
                "bad_request",
                f"invalid model id in subject {msg.subject[:80]!r}: use hecate.infer.<slug>",
                "",
            )
        if len(msg.data) > self.max_request_bytes:
            return await self._reject(
                reply_to,
                "payload_too_large",
                f"{len(msg.data)} bytes > limit {self.max_request_bytes}",
                model_id,
            )
        try:
            request = _infer.decode(msg.data)
        except msgspec.DecodeError as exc:
            return await self._reject(reply_to, "bad_request", f"invalid request: {exc}", model_id)
        if self.view.router is None:
            return await self._reject(
                reply_to, "no_plan", "no plan yet: the planner has not published one", model_id
            )
        if request.request_id:
            ident = (request.tenant, request.request_id)
            if await self.retries.repeat(ident, reply_to):
                return None
            if request.attempt > 1 and reply_to:
                # A retry that may belong to another replica: find it before running it.
                return await self.retries.ask_owner(msg, ident, reply_to)
        await self._admit(msg, model_id, request, reply_to)
        return None

    async def _admit(self, msg: Msg, model_id: str, request: InferRequest, reply_to: str) -> None:
        """A new request: give it an id and a span, then the quota desk or a route."""
        self._next += 1
        key = self._next
        request_id = request.request_id or f"{self.instance_id}-{key}"
        span = (
            self.tracer.start_span(
                "router infer",
                context=tracing.extract(msg.headers),
                kind=SpanKind.SERVER,
                attributes={"hecate.model": model_id, "hecate.request_id": request_id},
            )
            if self.tracing
            else INVALID_SPAN
        )
        admission = Admission(
            key=key,
            request_id=request_id,
            model_id=model_id,
            reply_to=reply_to,
            request=request,
            span=span,
            ticket=request.quota_ticket,
        )
        if self.enforce_quotas:
            return await self.quotas.ask(admission)
        return await self._start(admission)

    async def _start(self, a: Admission) -> None:
        """Admitted: choose a route and send the first stage; or, when every healthy
        pipeline is at its limit, wait in line for room."""
        assert self.view.router is not None
        if self.cancels and (a.request.tenant, a.request.request_id) in self.cancels:
            self.counters["cancelled"] += 1
            a.span.end()
            return await self._reject(
                a.reply_to,
                "cancelled",
                "the caller cancelled the request",
                a.model_id,
                a.request_id,
            )
        try:
            route, degraded, probes = self.view.choose(
                a.model_id, RoutingRequest(tokens=a.request.max_tokens), self.admission.full()
            )
        except Saturated:
            return await self._wait_for_room(a)
        except RoutingError as exc:
            a.span.set_status(Status(StatusCode.ERROR, exc.code))
            a.span.end()
            return await self._reject(a.reply_to, exc.code, exc.message, a.model_id, a.request_id)
        flight = Flight(
            key=a.key,
            request_id=a.request_id,
            model_id=a.model_id,
            reply_to=a.reply_to,
            request=a.request,
            route=route,
            span=a.span,
            started=time.monotonic(),
        )
        flight.degraded = degraded
        flight.probes = probes
        flight.session = f"{a.request_id}.1"
        flight.acts[0] = b""  # layer 0's input is the prompt itself
        if a.request.request_id:
            flight.idempotency = (a.request.tenant, a.request.request_id)
            self.retries.started(flight.idempotency, a.key)
        self.flights[a.key] = flight
        self.view.router.begin(route)
        self.admission.began(route.pipeline_id)
        await self._dispatch(flight)
        return None

    async def _wait_for_room(self, a: Admission) -> None:
        now = time.monotonic()
        if self.admission.wait(a.model_id, a.request.tenant, a, now):
            self.counters["queued"] += 1
            return None
        return await self._refuse_busy(a, "the line for room is full", now)

    async def _refuse_busy(self, a: Admission, why: str, now: float) -> None:
        """Overload's honest answer: not now, and when to come back."""
        retry = self.admission.retry_after_s(a.model_id, now)
        a.span.set_status(Status(StatusCode.ERROR, "rate_limited"))
        a.span.end()
        self.counters["rate_limited_load"] += 1
        await self._reject(
            a.reply_to,
            "rate_limited",
            f"every healthy pipeline of {a.model_id!r} is busy and {why}; retry in {retry:.1f} s",
            a.model_id,
            a.request_id,
            retry,
        )

    async def _admit_waiting(self, model_id: str) -> None:
        """Room may have opened on ``model_id``: start who is next in line, in turn per
        tenant, while some pipeline has room. (With no healthy pipeline left at all they
        start too: the route choice then finds a rescue, or the error that says why.)"""
        if not self.admission.waiting(model_id):
            return  # the common case, on every answer: nobody in line
        while self.view.router is not None and not self.view.saturated(
            model_id, self.admission.full()
        ):
            a = self.admission.next(model_id)
            if a is None:
                return
            await self._start(a)

    async def _reject(
        self,
        reply_to: str,
        code: ErrorCode,
        message: str,
        model_id: str,
        request_id: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        self.stats.num_errors += 1
        self.stats.last_error = f"{code}: {message}"[:256]
        self.counters[f"rejected_{code}"] += 1
        if self.counters[f"rejected_{code}"] == 1:
            event(self.log, "request rejected", logging.WARNING, code=code, message=message)
        if reply_to:
            body = InferReply(
                ok=False,
                error=ErrorBody(code=code, message=message, retry_after_s=retry_after_s),
                model_id=model_id,
                request_id=request_id,
                retry_after_s=retry_after_s,
            )
            await self.service.nc.publish(
                reply_to,
                _json.encode(body),
                headers=error_headers(code, message, retry_after_s),
            )

    # -- stages --------------------------------------------------------------------------

    async def _dispatch(self, flight: Flight) -> None:
        """Send the flight's current stage. In ``chain`` mode that request carries the
        rest of the route and the nodes forward to each other; in ``hop`` mode the
        router sends each stage itself and keeps every activation in between.

        Called only by whoever holds the flight's last outcome (see flights.py), or for
        its first send; a flight answered meanwhile (the drain) is not sent again."""
        if not live(self.flights, flight):
            return
        route = flight.route
        stage = route.stages[flight.stage]
        chain = route.stages[flight.stage + 1 :] if self.dispatch_mode == "chain" else ()
        last = flight.stage == len(route.stages) - 1
        base = flight.next_send()
        if flight.stage == 0:
            flight.step_at = time.monotonic()
        flight.deadline = time.monotonic() + self.stage_timeout_s * (1 + len(chain))
        if self.tracing:
            flight.stage_span = self.tracer.start_span(
                f"stage {stage.node_id}",
                context=set_span_in_context(flight.span),
                kind=SpanKind.CLIENT,
                attributes={
                    "hecate.node": stage.node_id,
                    "hecate.layers": f"{stage.layer_start}-{stage.layer_end}",
                    "hecate.attempt": flight.attempts,
                    "hecate.chained_stages": len(chain),
                },
            )
        request = StageRequest(
            request_id=flight.request_id,
            model_id=route.model_id,
            layer_start=stage.layer_start,
            layer_end=stage.layer_end,
            model_layers=self.view.layers(route.model_id),
            epoch=self.view.epoch,
            prompt=flight.request.prompt if stage.layer_start == 0 else "",
            activation=flight.acts.get(stage.layer_start, b""),
            decode_tokens=flight.request.max_tokens if (last or chain) else None,
            chain=chain,
            reply_base=f"{self.inbox}.{base}" if chain else "",
            stage_index=flight.stage,
            session=flight.session,
            position=flight.position,
            tokens=flight.step_tokens if stage.layer_start == 0 else None,
            messages=flight.request.messages if stage.layer_start == 0 else None,
            temperature=flight.request.temperature,
            top_p=flight.request.top_p,
            seed=flight.request.seed,
            step=len(flight.generated),
        )
        headers = (
            tracing.inject({}, set_span_in_context(flight.stage_span))
            if flight.stage_span is not None
            else None
        )
        body = _msgpack.encode(request)
        try:
            await self.service.nc.publish(
                subjects.node_run(stage.node_id),
                body,
                reply=f"{self.inbox}.{base}-{flight.stage}",
                headers=headers,
            )
        except MaxPayloadError:  # the request outgrew the bus: nobody failed
            if claim(self.flights, flight, base):
                await self._finish_error(
                    flight,
                    "payload_too_large",
                    f"stage {flight.stage} of the route needs {len(body):,} bytes, over the "
                    f"bus's max_payload of {self.service.nc.max_payload:,}: the prompt is too "
                    "long for this swarm",
                )
        except Exception as exc:  # disconnected: fail over like any stage failure
            await self._stage_failed(flight, base, stage.node_id, f"publish failed: {exc!r}")

    async def _on_stage_reply(self, msg: Msg) -> None:
        # Reply tokens are "<flight>-<send>-<stage>": the stage says who answered (or,
        # for a no-responders status, who is missing), even for chained stages.
        token = msg.subject.rsplit(".", 1)[-1]
        if token[:1] == "q" and token[1:].isdigit():
            return await self.quotas.on_reply(int(token[1:]), msg)
        if token[:1] == "r" and token[1:].isdigit():
            self.retries.handed_over(int(token[1:]))  # its owner answered the client
            return None
        base, _, index = token.rpartition("-")
        key = int(base.split("-", 1)[0]) if token[:1].isdigit() else -1
        flight = self.flights.get(key)
        if (
            flight is None
            or not index.isdigit()
            or not flight.stage <= int(index) < len(flight.route.stages)
            or not claim(self.flights, flight, base)
        ):
            self.counters["late_replies"] += 1  # an answer to a send we gave up on
            return None
        at = int(index)
        flight.stage = at
        node_id = flight.route.stages[at].node_id
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            return await self._fail_over(flight, node_id, "no responders")
        try:
            reply = _stage_reply.decode(msg.data)
        except msgspec.DecodeError as exc:
            return await self._fail_over(flight, node_id, f"unreadable reply: {exc}")
        if not reply.ok:
            err = reply.error or ErrorBody(code="internal", message="no error body")
            if err.code == "no_responders":  # relayed by the node that chained to it
                return await self._fail_over(flight, node_id, "no responders")
            if err.code in REQUEST_FAULTS:
                return await self._finish_error(flight, as_code(err.code), err.message)
            return await self._fail_over(
                flight, node_id, f"{err.code}: {err.message}", err.retry_after_s
            )
        if flight.stage_span is not None:
            flight.stage_span.end()
            flight.stage_span = None
        stage = flight.route.stages[flight.stage]
        done = (
            flight.route.stages[: flight.stage + 1]
            if at == len(flight.route.stages) - 1 and self.dispatch_mode == "chain"
            else (stage,)
        )
        for s in done:
            await self._report(flight, s.node_id, ok=True)
        if reply.prompt_tokens is not None:
            flight.prompt_tokens = reply.prompt_tokens
        if flight.stage == len(flight.route.stages) - 1:
            if reply.token is not None:
                return await self._generated(flight, reply)
            return await self._finish(flight, reply.output or "")
        flight.acts[stage.layer_end] = reply.activation
        flight.stage += 1
        await self._dispatch(flight)
        return None

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.view.expire_suspicions()
            if self.view.breakers is not None:
                for target in self.view.breakers.due(time.time()):
                    self.service.spawn(self.view.breakers.lease(target))
            now = time.monotonic()
            if self.quotas.admissions:
                await self.quotas.sweep(now)
            if self.retries.pending:
                await self.retries.sweep(now)
            for _model_id, waited in list(self.admission.expired(now)):
                await self._refuse_busy(
                    waited, f"it waited {self.admission.max_wait_s:.1f} s in line", now
                )
            for model_id in self.admission.models_waiting():
                await self._admit_waiting(model_id)  # pipelines may have come back
            if self.view.breakers is not None:
                self.view.breakers.redeliver(self.service.spawn)
            for flight, send in expired(self.flights, now):
                node_id = flight.route.stages[flight.stage].node_id
                await self._stage_failed(
                    flight, send, node_id, f"no reply within {self.stage_timeout_s:.1f} s"
                )

    # -- failure and failover ------------------------------------------------------------

    async def _stage_failed(
        self,
        flight: Flight,
        send: str,
        node_id: str,
        reason: str,
        retry_after_s: float | None = None,
    ) -> None:
        """A failure of ``send`` seen by the sweep, the node-down event or a failed
        publish: acted on only if it is the first outcome of that send (claim), so a
        flight that has answered, moved on or failed over already is left alone."""
        if not claim(self.flights, flight, send):
            self.counters["stale_failures"] += 1
            return
        await self._fail_over(flight, node_id, reason, retry_after_s)

    async def _fail_over(
        self,
        flight: Flight,
        node_id: str,
        reason: str,
        retry_after_s: float | None = None,
    ) -> None:
        """The claimed outcome of the flight's last send is a failure on ``node_id``:
        resend, reroute or answer with an error. Only the holder of the claim gets here."""
        assert self.view.router is not None
        if (
            reason == "no responders"
            and time.monotonic() - self.service.reconnected_at < self.reconnect_grace_s
            and (self.dispatch_mode == "hop" or flight.stage == 0)
        ):
            # The server just came back: the node may simply not have resubscribed yet.
            # Send the same stage again shortly, without blaming anyone (in a chain, only
            # when its first stage was the one missing: later ones already ran).
            self.counters["resent_after_reconnect"] += 1
            self.service.spawn(self._resend(flight))
            return None
        if flight.stage_span is not None:
            flight.stage_span.set_status(Status(StatusCode.ERROR, reason))
            flight.stage_span.end()
            flight.stage_span = None
        if reason != "no responders" and not reason.startswith("node down"):
            # Liveness is telemetry's business (a node it declares down is routed
            # around, and usable again at its next heartbeat); errors and slowness are
            # the breaker's.
            await self._report(
                flight,
                node_id,
                ok=False,
                code=reason.split(":", 1)[0][:40],
                retry_after_s=retry_after_s,
            )
        self.view.suspect(node_id)
        old = flight.route
        result = self.view.rescue(old, node_id, RoutingRequest(tokens=flight.request.max_tokens))
        kind = result.kind if isinstance(result, Recovered) else "unrecoverable"
        new = result.route if isinstance(result, Recovered) else None
        if not live(self.flights, flight):  # answered meanwhile (the drain): nothing to do
            return None
        self.counters["failovers"] += 1
        self.counters[f"failover_{kind}"] += 1
        flight.span.add_event(
            "failover", {"hecate.lost_node": node_id, "hecate.kind": kind, "hecate.reason": reason}
        )
        failover = FailoverEvent(
            request_id=flight.request_id,
            model_id=flight.model_id,
            lost_node=node_id,
            kind=kind,
            old_route=old,
            new_route=new,
            attempt=flight.attempts,
            reason=reason,
            router_id=self.instance_id,
            at=time.time(),
        )
        await self.service.nc.publish(subjects.EVENT_FAILOVER, _json.encode(failover))
        event(
            self.log,
            "failover",
            request_id=flight.request_id,
            lost_node=node_id,
            kind=kind,
            reason=reason,
            attempt=flight.attempts,
        )
        if not isinstance(result, Recovered):
            if reason.startswith("rate_limited") and retry_after_s is not None:
                # Nothing else can serve it, and the upstream said when it can: pass that on.
                return await self._finish_error(flight, "rate_limited", reason, retry_after_s)
            return await self._finish_error(flight, result.code, result.message)
        if flight.prompt_tokens is not None and flight.replays >= self.max_replays:
            return await self._finish_error(
                flight,
                "unrecoverable",
                f"migration limit: the generation was already replayed {flight.replays} "
                f"time(s); last loss: {node_id} ({reason})",
            )
        if flight.attempts >= self.max_attempts:
            return await self._finish_error(
                flight,
                "unrecoverable",
                f"gave up after {flight.attempts} attempts; last loss: {node_id} ({reason})",
            )
        flight.attempts += 1
        self.counters["retries"] += 1
        if result.route.model_id != old.model_id:  # a reserve model starts from its prompt
            flight.acts = {0: b""}
        flight.degraded = flight.degraded or result.degraded
        if not live(self.flights, flight):  # answered meanwhile (the drain): nothing to do
            return None
        self.view.router.end(old)  # the rescue route carries this request's load from now on
        self.admission.moved(old.pipeline_id, result.route.pipeline_id)
        flight.route = result.route
        # The rescue route spends any probe lease held for a target on it, as a first
        # route does: one probe, tracked, never a second one sent on the side. A probe
        # this flight carried for a target the rescue route leaves out is given back.
        kept = {t for t in flight.probes if t in result.route.node_ids}
        self._give_back(flight.probes - kept)
        flight.probes = kept | self.view.take(result.route)
        # A fresh session per attempt: caches a dead route left half-built are never mixed.
        if self.view.keeps_sessions(old.model_id):  # whether or not a reply came back
            await self._release(old, flight.session)
        flight.session = f"{flight.request_id}.{flight.attempts}"
        if flight.prompt_tokens is not None:
            # Generation: the rescue route's caches are empty; replay the prompt and every
            # token generated so far in one prefill, then carry on where the stream was.
            self.counters["replays"] += 1
            flight.replays += 1
            flight.acts = {0: b""}
            flight.position = 0
            flight.step_tokens = flight.prompt_tokens + flight.generated
        # Resume at the last stage whose input we already hold (layer 0 = the prompt).
        flight.stage = max(
            i for i, s in enumerate(result.route.stages) if s.layer_start in flight.acts
        )
        self.view.router.begin(flight.route)
        await self._dispatch(flight)
        return None

    async def _resend(self, flight: Flight) -> None:
        """The same stage again, shortly; this task holds the claim of the send that
        met no responders, so nothing else acts on the flight meanwhile."""
        await asyncio.sleep(0.1)
        await self._dispatch(flight)

    async def _report(
        self,
        flight: Flight,
        node_id: str,
        *,
        ok: bool,
        code: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        """A stage's outcome to the shared breaker; a probe this flight carried for
        ``node_id`` is delivered with it."""
        flight.probes.discard(node_id)
        if self.view.breakers is not None:
            await self.view.breakers.report(node_id, ok=ok, code=code, retry_after_s=retry_after_s)

    def _give_back(self, probes: set[str]) -> None:
        if probes and self.view.breakers is not None:
            self.view.breakers.abandon(probes)
            self.view.rebuild()

    # -- answers -----------------------------------------------------------------------

    async def _generated(self, flight: Flight, reply: StageReply) -> None:
        """The last stage sampled a token: stream it, then the next step or the end."""
        assert reply.token is not None
        fed = flight.step_tokens if flight.step_tokens else (flight.prompt_tokens or [])
        steps = len(fed) if reply.positions is None else reply.positions
        if steps == 1 and flight.attempts == 1:  # a decode step: what admission is fitted to
            now = time.monotonic()
            self.admission.sample(flight.route.pipeline_id, now - flight.step_at, now)
        flight.position += steps
        if 0 < steps < len(fed):
            # A long prompt (or replay) runs a chunk per step, so that its activations
            # fit the bus and other sessions' steps are served in between: this token
            # is not the next one yet; the rest of the sequence goes next.
            self.counters["prefill_chunks"] += 1
            flight.step_tokens = fed[steps:]
            flight.stage = 0
            flight.acts = {0: b""}
            await self._dispatch(flight)
            return None
        flight.generated.append(reply.token)
        done = reply.eos or len(flight.generated) >= flight.request.max_tokens
        if flight.request.stop and not reply.eos:
            text = "".join(flight.text) + reply.text
            cut = min(
                (i for i in (text.find(s) for s in flight.request.stop if s) if i >= 0), default=-1
            )
            if cut >= 0:  # a stop string: end here, without it
                flight.text = [text[:cut]]
                flight.finish_reason = "stop"
                return await self._finish(flight, flight.text[0])
        if not reply.eos:
            flight.text.append(reply.text)
            if flight.request.stream_to:
                token = StreamToken(
                    request_id=flight.request_id,
                    index=len(flight.generated) - 1,
                    token=reply.token,
                    text=reply.text,
                )
                await self.service.nc.publish(
                    subjects.token_stream(flight.request.stream_to), _json.encode(token)
                )
        if done:
            flight.eos = reply.eos
            flight.finish_reason = "stop" if reply.eos else "length"
            return await self._finish(flight, "".join(flight.text))
        flight.step_tokens = [reply.token]
        flight.stage = 0
        flight.acts = {0: b""}
        await self._dispatch(flight)
        return None

    async def _finish(self, flight: Flight, output: str) -> None:
        if flight.prompt_tokens is None and flight.attempts == 1:  # one pass, not generation
            now = time.monotonic()
            self.admission.sample(flight.route.pipeline_id, now - flight.started, now)
        if not self._land(flight):
            return
        if flight.degraded:
            self.counters["degraded"] += 1
            flight.span.set_attribute("hecate.degraded", True)
        self.counters["answered"] += 1
        reply = InferReply(
            ok=True,
            output=output,
            route=flight.route,
            degraded=flight.degraded,
            attempts=flight.attempts,
            request_id=flight.request_id,
            model_id=flight.model_id,
            **flight.usage(),
        )
        flight.span.end()
        await self._answer(flight, _json.encode(reply), None)
        await self._admit_waiting(flight.model_id)

    async def _finish_error(
        self, flight: Flight, code: ErrorCode, message: str, retry_after_s: float | None = None
    ) -> None:
        if not self._land(flight):
            return
        self.counters[f"error_{code}"] += 1
        self.stats.num_errors += 1
        self.stats.last_error = f"{code}: {message}"[:256]
        flight.span.set_status(Status(StatusCode.ERROR, code))
        flight.span.end()
        reply = InferReply(
            ok=False,
            output="".join(flight.text) or None,  # a generation's text so far, if any
            route=flight.route,
            degraded=flight.degraded,
            attempts=flight.attempts,
            request_id=flight.request_id,
            model_id=flight.model_id,
            error=ErrorBody(code=code, message=message, retry_after_s=retry_after_s),
            retry_after_s=retry_after_s,
            **flight.usage(),
        )
        await self._answer(flight, _json.encode(reply), error_headers(code, message, retry_after_s))
        await self._admit_waiting(flight.model_id)

    async def _answer(self, flight: Flight, body: bytes, headers: dict[str, str] | None) -> None:
        """Reply to the request and to every retry of it that joined while it ran; then
        a generation's nodes may drop its session."""
        if flight.idempotency is not None:
            self.retries.finished(flight.idempotency, body, headers)
        for reply_to in (flight.reply_to, *flight.also_reply_to):
            if reply_to:
                await self.service.nc.publish(reply_to, body, headers=headers)
        if self.view.keeps_sessions(flight.route.model_id):
            await self._release(flight.route, flight.session)

    async def _on_cancel(self, msg: Msg) -> None:
        """A caller gave up: the flight, if it runs here, is answered ``cancelled`` now
        (its next token is never asked for) and its nodes drop the session. Every
        replica hears the cancel; one not running the request remembers it, in case the
        request is still waiting here for its quota or a place in line."""
        try:
            cancel = _cancel.decode(msg.data)
        except msgspec.DecodeError as exc:
            if msg.reply:
                await self.service.reply_error(msg.reply, "bad_request", f"invalid cancel: {exc}")
            return
        ident = (cancel.tenant, cancel.request_id)
        key = self.retries.in_progress.get(ident)
        flight = self.flights.get(key) if key is not None else None
        if flight is None:
            self.cancels[ident] = None
            while len(self.cancels) > REMEMBER_CANCELS:
                self.cancels.popitem(last=False)
            return
        self.counters["cancelled"] += 1
        flight.span.add_event("cancelled")
        event(
            self.log,
            "cancelled",
            request_id=flight.request_id,
            tokens=len(flight.generated),
        )
        await self._finish_error(flight, "cancelled", "the caller cancelled the request")

    async def _release(self, route: Route, session: str) -> None:
        """Tell the route's nodes that ``session`` is over: they drop its caches now,
        not when they idle out, and refuse any step of it still on its way."""
        body = _json.encode(SessionRelease(session=session))
        for node_id in dict.fromkeys(s.node_id for s in route.stages):
            try:
                await self.service.nc.publish(subjects.node_release(node_id), body)
            except Exception as exc:  # disconnected: the caches idle out instead
                event(self.log, "release not sent", logging.DEBUG, error=repr(exc))
                return
        self.counters["sessions_released"] += 1

    async def _on_node_down(self, msg: Msg) -> None:
        """Telemetry declared a node dead: a stage already delivered to it will never be
        answered (no no-responders either), so fail those flights over now rather than
        at their stage timeout."""
        try:
            down = _node_event.decode(msg.data)
        except msgspec.DecodeError:
            return
        chained = self.dispatch_mode == "chain"
        for flight, send in waiting_on(self.flights, down.node_id, chained=chained):
            await self._stage_failed(flight, send, down.node_id, f"node down: {down.reason}")

    def _join(self, key: int, reply_to: str) -> bool:
        """A retry of a request in flight here gets the same answer when it lands."""
        flight = self.flights.get(key)
        if flight is None:
            return False
        if reply_to:
            flight.also_reply_to.append(reply_to)
        return True

    async def _admit_again(self, msg: Msg) -> None:
        """A retry nobody claimed: run it as a new request."""
        model_id = subjects.model_from_infer_subject(msg.subject) or ""
        await self._admit(msg, model_id, _infer.decode(msg.data), msg.reply or "")

    def _land(self, flight: Flight) -> bool:
        """Out of the table, once: True for the caller that answers the flight."""
        if not land(self.flights, flight):
            self.counters["answers_suppressed"] += 1
            return False
        if self.view.router is not None:
            self.view.router.end(flight.route)
        self.admission.ended(flight.route.pipeline_id, flight.model_id, time.monotonic())
        if flight.stage_span is not None:
            flight.stage_span.end()
            flight.stage_span = None
        self._give_back(flight.probes)
        flight.probes = set()
        return True
