"""A router's desk's actions, carried out as publishes: stages to nodes, tokens and
answers to callers, failover events, session releases, breaker reports, and asks of
the quota desk and the other replicas.

The :class:`Publisher` holds what only the process has: the bus's handle of every call
still to answer (by its number) and the span of each flight's stage in the air. It
decides nothing; a publish that fails comes back as an event for the desk.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import Counter
from time import monotonic as now

import msgspec
from nats.errors import MaxPayloadError
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace import set_span_in_context as in_span

from hecate.bus import tracing
from hecate.bus.logs import event
from hecate.bus.service import Request, Service
from hecate.core import Route
from hecate.wire import subjects
from hecate.wire.errors import as_code
from hecate.wire.messages import (
    STREAM_TOKEN_HEADERS,
    Failover,
    FailoverEvent,
    InferRequest,
    SessionRelease,
)
from hecate_router import desk_flow as d
from hecate_router.breakers import BreakerView
from hecate_router.flow import Failure

_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


class Publisher:
    def __init__(self, service: Service, breakers: BreakerView, counters: Counter[str]) -> None:
        self.service = service
        self.breakers = breakers
        self.counters = counters
        self.calls: dict[int, Request[InferRequest]] = {}  # answered later, by number
        self.stage_spans: dict[int, Span] = {}  # per flight, its stage in the air
        self.inbox = ""  # the router's reply inbox, once connected

    async def carry_out(self, acts: list[d.Action]) -> list[d.Event]:
        """Publish what ``acts`` say; the events it brings back (a publish failed).

        Never raises: an act that cannot be carried out (one request's data that will
        not encode, a bug) is logged and counted, and a stage that never left fails
        its own request; the other acts, and the loop that fed them, go on."""
        back: list[d.Event] = []
        for act in acts:
            try:
                failed = await self._carry_out(act)
            except Exception as exc:
                self.counters["acts_failed"] += 1
                event(
                    self.service.log,
                    "act failed",
                    logging.ERROR,
                    act=type(act).__name__,
                    error=repr(exc),
                    exception="".join(traceback.format_exception(exc)),
                )
                if isinstance(act, d.Dispatch):
                    why = Failure("unsendable", f"the stage could not be sent: {exc!r}")
                    failed = d.StageHeard(act.flight, act.send.send, act.send.stage, why, now())
            if failed is not None:
                back.append(failed)
        return back

    async def _carry_out(self, act: d.Action) -> d.Event | None:
        match act:
            case d.Dispatch():
                return await self._dispatch(act)
            case d.Streamed(call, token):
                # On the caller's own reply path (nowhere else), from the connection
                # the answer leaves by, so the tokens arrive before it.
                req = self.calls.get(call)
                if req is not None and req.reply:
                    body = _json.encode(token)
                    await self.service.nc.publish(req.reply, body, headers=STREAM_TOKEN_HEADERS)
            case d.Respond():
                await self._respond(act)
            case d.Report(node_id, ok, code, retry_after_s):
                await self.breakers.report(node_id, ok=ok, code=code, retry_after_s=retry_after_s)
            case d.Release(route, session):
                await self._release(route, session)
            case d.FailedOver(flight, f):
                await self._failed_over(flight, f)
            case d.AskQuota(call, ask):
                reply = f"{self.inbox}.q{call}"
                if not await self._publish(subjects.QUOTA_ACQUIRE, _json.encode(ask), reply):
                    return d.QuotaAnswered(call, None, now())
            case d.AskOwner(claim, ask):
                # Unsent: nobody hears the claim, so it runs here when its time is up.
                reply = f"{self.inbox}.r{claim}"
                await self._publish(subjects.ROUTER_RETRIES, _json.encode(ask), reply)
            case d.Forget(call):
                req = self.calls.pop(call, None)
                if req is not None:
                    req.span.end()
            case d.OwnRetry():
                pass  # the claim's endpoint answers it
        return None

    async def _publish(self, subject: str, body: bytes, reply: str) -> bool:
        try:
            await self.service.nc.publish(subject, body, reply=reply)
        except Exception as exc:  # disconnected
            event(self.service.log, "not sent", logging.DEBUG, subject=subject, error=repr(exc))
            return False
        return True

    async def _dispatch(self, act: d.Dispatch) -> d.StageHeard | None:
        s, flight = act.send, act.flight
        base = f"{self.inbox}.{flight}-{s.send}"
        request = msgspec.structs.replace(s.request, reply_base=base) if s.chained else s.request
        headers = None
        if self.service.tracing and (req := self.calls.get(flight)) is not None:
            self._end_stage_span(flight)
            span = self.stage_spans[flight] = self.service.tracer.start_span(
                f"stage {s.node_id}",
                context=in_span(req.span),
                kind=SpanKind.CLIENT,
                attributes={
                    "hecate.node": s.node_id,
                    "hecate.layers": f"{request.layer_start}-{request.layer_end}",
                    "hecate.attempt": act.attempt,
                    "hecate.chained_stages": s.chained,
                },
            )
            headers = tracing.inject({}, in_span(span))
        failure: Failure | None = None
        try:
            # Every number was bounded at the request's decode; a stage that still will
            # not encode is that request's to fail, not the router's.
            body = _msgpack.encode(request)
        except (OverflowError, TypeError, ValueError) as exc:
            why = f"stage {s.stage} of the route cannot be encoded: {exc}"
            return d.StageHeard(flight, s.send, s.stage, Failure("unsendable", why), now())
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
        if failure is None:
            return None
        return d.StageHeard(flight, s.send, s.stage, failure, now())

    async def _respond(self, act: d.Respond) -> None:
        reply, err = act.reply, act.reply.error if act.reply is not None else None
        for n, call in enumerate(act.calls):
            req = self.calls.pop(call, None)
            if req is None:
                continue
            if n == 0:
                self._end_stage_span(call)
                if reply is not None and reply.degraded:
                    req.span.set_attribute("hecate.degraded", True)
            if reply is not None and err is not None:
                req.span.set_status(Status(StatusCode.ERROR, err.code))
                code = as_code(err.code)
                await req.error(code, err.message, retry_after_s=err.retry_after_s, body=reply)
            else:
                await req.respond(act.body or (reply if reply is not None else b""), act.headers)
        for subject in act.to:
            await self.service.nc.publish(subject, act.body, headers=act.headers)

    async def _failed_over(self, flight: int, f: Failover) -> None:
        span = self.stage_spans.get(flight)
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, f.reason))
        self._end_stage_span(flight)
        req = self.calls.get(flight)
        if req is not None:
            req.span.add_event(
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

    async def _release(self, route: Route, session: str) -> None:
        """Tell the route's nodes that ``session`` is over: they drop its caches now,
        not when they idle out, and refuse any step of it still on its way."""
        body = _json.encode(SessionRelease(session=session))
        for node_id in dict.fromkeys(route.node_ids):
            try:
                await self.service.nc.publish(subjects.node_release(node_id), body)
            except Exception as exc:  # disconnected: the caches idle out instead
                event(self.service.log, "release not sent", logging.DEBUG, error=repr(exc))
                return
        self.counters["sessions_released"] += 1

    def _end_stage_span(self, flight: int) -> None:
        span = self.stage_spans.pop(flight, None)
        if span is not None:
            span.end()
