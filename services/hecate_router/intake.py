"""A router's way in: from an infer request on the bus to a flight, or an honest refusal.

In order: a retry of a request this replica has (or had) joins it or gets its answer
again, or is answered ``rate_limited`` when that request holds enough retries already
(retries.py); a retry that may be another replica's is claimed first; the
tenant's quota, when enforced, is asked of the shared desk (quotagate.py); a request
cancelled meanwhile is answered ``cancelled``; then a route, or a place in line while
every healthy pipeline is at its limit (admission.py), or ``rate_limited`` with when to
come back. Each request is answered through its deferred :class:`Request` handle.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping

import msgspec
from opentelemetry.trace import Status, StatusCode

from hecate.bus.logs import event
from hecate.bus.service import Request, Service
from hecate.core import RoutingError, RoutingRequest
from hecate.core.errors import ErrorCode, Saturated
from hecate.wire import subjects
from hecate.wire.messages import ErrorBody, InferReply, InferRequest
from hecate_router.admission import AdmissionDesk
from hecate_router.config import RouterConfig
from hecate_router.flightdeck import Flight, FlightDeck
from hecate_router.flow import RetryJoined
from hecate_router.identity import Refused, tenant_of
from hecate_router.quotagate import Admission, QuotaGate
from hecate_router.retries import Caller, RetryLedger
from hecate_router.swarmview import SwarmView

REMEMBER_CANCELS = 4096  # cancels of requests not (yet) in flight here


class Intake:
    def __init__(
        self,
        service: Service,
        config: RouterConfig,
        view: SwarmView,
        counters: Counter[str],
        admission: AdmissionDesk[Admission],
        deck: FlightDeck,
    ) -> None:
        self.service = service
        self.config = config
        self.view = view
        self.counters = counters
        self.admission = admission
        self.deck = deck
        deck.on_landed = self.landed
        self.cancels: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.retries = RetryLedger(
            service,
            counters=counters,
            waiting=self.waiting,
            join=self.join,
            admit=self.admit,
            remember=config.remember_answers,
            remember_bytes=config.remember_answer_bytes,
            max_joined=config.max_joined_retries,
        )
        self.quotas = QuotaGate(
            service, start=self.start, counters=counters, timeout_s=config.quota_timeout_s
        )
        self._next = 0

    async def on_infer(self, req: Request[InferRequest]) -> None:
        model_id = subjects.model_from_infer_subject(req.subject)
        if model_id is None:
            why = (
                f"invalid model id in subject {req.subject[:80]!r}: "
                "use hecate.infer.<slug> (hecate.stream.<slug> to stream)"
            )
            await req.error("bad_request", why)
            return
        if self.view.router is None:
            await req.error("no_plan", "no plan yet: the planner has not published one")
            return
        if not await self.vouch(req):
            return
        request = req.body
        if request.request_id:
            ident = (request.tenant, request.request_id)
            if await self.retries.repeat(ident, req):
                return
            doubted = request.attempt > 1 or self.retries.doubted(time.monotonic())
            if doubted and req.reply:
                # A retry (or a request that waited out a freeze of this replica) that may
                # belong to another replica: find it before running it.
                await self.retries.ask_owner(req, ident)
                return
        await self.admit(req)

    async def vouch(self, req: Request[InferRequest]) -> bool:
        """Settle whom the request acts for (routing/identity.py) and whether its tokens
        are streamed (the subject it came on says): from here on its body says so, so
        quotas, retries, cancels and the line all key on that tenant. A request refused
        is answered ``forbidden``, logged once and counted."""
        body = req.body
        tenant = self.tenant(req.headers, body.tenant, req.subject)
        if isinstance(tenant, Refused):
            await req.error("forbidden", tenant.message)
            return False
        stream = subjects.is_stream(req.subject)
        if tenant != body.tenant or stream != body.stream:
            req.body = msgspec.structs.replace(body, tenant=tenant, stream=stream)
        req.span.set_attribute("hecate.tenant", tenant)
        return True

    def tenant(self, headers: Mapping[str, str], named: str, subject: str) -> str | Refused:
        """Whom a request or a cancel acts for (routing/identity.py); a refusal is
        logged, with the account the server named, and counted."""
        tenant = tenant_of(self.config.tenant_from, headers, named)
        if isinstance(tenant, Refused):
            self.counters["forbidden"] += 1
            event(
                self.service.log,
                "refused: tenant",
                logging.WARNING,
                vouched=tenant.vouched,
                named=named,
                subject=subject,
            )
        return tenant

    async def admit(self, req: Request[InferRequest]) -> None:
        """A new request: an id, then the quota desk or a route."""
        self._next += 1
        model_id = subjects.model_from_infer_subject(req.subject) or ""
        request_id = req.body.request_id or f"{self.config.instance_id}-{self._next}"
        req.span.set_attribute("hecate.model", model_id)
        req.span.set_attribute("hecate.request_id", request_id)
        a = Admission(self._next, request_id, model_id, req, ticket=req.body.quota_ticket)
        if self.config.enforce_quotas:
            return await self.quotas.ask(a)
        return await self.start(a)

    async def start(self, a: Admission) -> None:
        """Admitted: choose a route and send the first stage; or, when every healthy
        pipeline is at its limit, wait in line for room."""
        request = a.handle.body
        if self.cancels and (request.tenant, request.request_id) in self.cancels:
            self.counters["cancelled"] += 1
            return await self.reject(a, "cancelled", "the caller cancelled the request")
        try:
            route, degraded, probes = self.view.choose(
                a.model_id, RoutingRequest(tokens=request.max_tokens), self.admission.full()
            )
        except Saturated:
            now = time.monotonic()
            if self.admission.wait(a.model_id, request.tenant, a, now, ticket=a.ticket):
                self.counters["queued"] += 1
                return None
            return await self.refuse_busy(a, "the line for room is full", since=now)
        except RoutingError as exc:
            return await self.reject(a, exc.code, exc.message)
        if request.request_id:
            self.retries.book.started((request.tenant, request.request_id), a.key)
        assert self.view.router is not None
        self.view.router.begin(route)
        self.admission.began(route.pipeline_id, a.model_id)
        await self.deck.launch(a, route, degraded, probes)
        return None

    async def refuse_busy(self, a: Admission, why: str, *, since: float) -> None:
        """Overload's honest answer: not now, when to come back, and a line ticket that
        keeps the place it held (it first asked at ``since``) for a caller back by then."""
        now = time.monotonic()
        retry = self.admission.retry_after_s(a.model_id)
        ticket = self.admission.ticket(a.model_id, a.handle.body.tenant, since, retry, now)
        self.counters["rate_limited_load"] += 1
        busy = f"every healthy pipeline of {a.model_id!r} is busy and {why}"
        message = f"{busy}; retry in {retry:.1f} s with quota_ticket {ticket} to keep its place"
        await self.reject(a, "rate_limited", message, retry, ticket=ticket)

    async def admit_waiting(self, model_id: str) -> None:
        """Room may have opened on ``model_id``: start who is next in line, in turn per
        tenant, while some pipeline has room."""
        if not self.admission.waiting(model_id):
            return  # the common case, on every answer: nobody in line
        while self.view.router is not None and not self.view.saturated(
            model_id, self.admission.full()
        ):
            a = self.admission.next(model_id)
            if a is None:
                return
            await self.start(a)

    async def reject(
        self,
        a: Admission,
        code: ErrorCode,
        message: str,
        retry_after_s: float | None = None,
        *,
        ticket: int | None = None,
    ) -> None:
        a.handle.span.set_status(Status(StatusCode.ERROR, code))
        body = InferReply(
            ok=False,
            error=ErrorBody(code=code, message=message, retry_after_s=retry_after_s),
            model_id=a.model_id,
            request_id=a.request_id,
            retry_after_s=retry_after_s,
            quota_ticket=ticket,
        )
        await a.handle.error(code, message, retry_after_s=retry_after_s, body=body)

    async def landed(self, flight: Flight) -> None:
        """A flight answered: its route's load ends, and its place may go to the line."""
        m = flight.machine
        if self.view.router is not None:
            self.view.router.end(m.route)
        self.admission.ended(m.route.pipeline_id, m.model_id, time.monotonic() - m.started)
        if flight.ident is not None:
            self.retries.book.finished(flight.ident, flight.answer)
        await self.admit_waiting(m.model_id)

    def cancelled(self, ident: tuple[str, str]) -> Flight | None:
        """The flight a cancel is for, if it runs here; else the cancel is remembered."""
        key = self.retries.book.in_progress.get(ident)
        flight = self.deck.flights.get(key) if key is not None else None
        if flight is None:
            self.cancels[ident] = None
            while len(self.cancels) > REMEMBER_CANCELS:
                self.cancels.popitem(last=False)
        return flight

    def waiting(self, key: int) -> int | None:
        """How many retries flight ``key`` holds for its answer: those that reached this
        replica and those another replica handed to its machine (every one is answered
        when it lands, flightdeck.py); None once it no longer runs here."""
        flight = self.deck.flights.get(key)
        if flight is None:
            return None
        return len(flight.joined) + len(flight.machine.also_reply_to)

    def join(self, key: int, caller: Caller) -> None:
        """A retry of a request in flight here gets the same answer when it lands."""
        flight = self.deck.flights[key]
        if isinstance(caller, str):  # it reached another replica, which asked us
            flight.machine.handle(RetryJoined(caller))
        else:
            flight.joined.append(caller)

    async def sweep(self, now: float) -> None:
        self.retries.tick(now)
        if self.quotas.admissions:
            await self.quotas.sweep(now)
        if self.retries.book.pending:
            await self.retries.sweep(now)
        for _model_id, waited, since in list(self.admission.expired(now)):
            await self.refuse_busy(
                waited, f"it waited {now - since:.1f} s in line, all the line allowed", since=since
            )
        for model_id in self.admission.models_waiting():
            await self.admit_waiting(model_id)  # pipelines may have come back
