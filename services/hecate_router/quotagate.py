"""The router's side of tenant quotas: ask the shared desk, never block on the answer.

A request of a tenant waits here (an :class:`Admission` with its :class:`QuotaWait`,
the pure machine in ``hecate_router.quota``) while the breaker service's quota desk
decides; the answer comes back on the router's inbox like a stage reply. Admitted: it
starts. Refused: the caller gets a 429-style reply with its own slot (``retry_after_s``,
``quota_ticket``, ``Retry-After`` headers). A tenant that prefers holding is held until
its slot, when the caller's ``max_wait_ms`` allows, then asks again with its ticket.
Without an answer from the desk the request is served: availability first, and counted
(``quota_unavailable``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from nats.aio.msg import Msg
from opentelemetry.trace import Status, StatusCode

from hecate.bus.service import NO_RESPONDERS, Request, Service
from hecate.wire import subjects
from hecate.wire.messages import ErrorBody, InferReply, InferRequest, QuotaReply, QuotaRequest
from hecate_router.admission import is_line_ticket
from hecate_router.quota import Admit, AskDesk, QuotaAction, QuotaWait, Refuse, holds

__all__ = ["Admission", "QuotaGate", "holds"]  # holds: also the herd benchmark's rule

_quota_reply = msgspec.json.Decoder(QuotaReply)
_json = msgspec.json.Encoder()


@dataclass(slots=True, eq=False)
class Admission:
    """A request on its way in: waiting for the quota desk, or for room on a pipeline;
    answered through its deferred ``handle``."""

    key: int
    request_id: str
    model_id: str
    handle: Request[InferRequest]
    ticket: int | None = None
    quota: QuotaWait | None = None


class QuotaGate:
    def __init__(
        self,
        service: Service,
        *,
        start: Callable[[Admission], Awaitable[None]],
        counters: Counter[str],
        timeout_s: float = 1.0,
    ) -> None:
        self.service = service
        self._start = start
        self.counters = counters
        self.quota_timeout_s = timeout_s
        self.inbox = ""  # the router's reply inbox, set when it starts
        self.admissions: dict[int, Admission] = {}

    async def ask(self, a: Admission) -> None:
        request = a.handle.body
        a.quota = QuotaWait(
            tenant=request.tenant,
            max_wait_ms=request.max_wait_ms,
            timeout_s=self.quota_timeout_s,
            counters=self.counters,
            # A line ticket is the router's own (its admission desk's), not the quota
            # desk's: the request asks the quota desk as a new one.
            ticket=None if is_line_ticket(a.ticket) else a.ticket,
        )
        self.admissions[a.key] = a
        await self._run(a, a.quota.start(time.monotonic()))

    async def on_reply(self, key: int, msg: Msg) -> None:
        a = self.admissions.get(key)
        if a is None or a.quota is None:
            return None
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            return await self._run(a, a.quota.unreachable())
        try:
            reply = _quota_reply.decode(msg.data)
        except msgspec.DecodeError:
            return await self._run(a, a.quota.unreachable())
        await self._run(a, a.quota.answered(reply, time.monotonic()))
        return None

    async def sweep(self, now: float) -> None:
        for a in list(self.admissions.values()):
            if a.quota is not None:
                await self._run(a, a.quota.tick(now))

    async def _run(self, a: Admission, actions: list[QuotaAction]) -> None:
        for action in actions:
            match action:
                case AskDesk(ticket):
                    request = a.handle.body
                    ask = QuotaRequest(
                        tenant=request.tenant, tokens=request.max_tokens, ticket=ticket
                    )
                    try:
                        await self.service.nc.publish(
                            subjects.QUOTA_ACQUIRE,
                            _json.encode(ask),
                            reply=f"{self.inbox}.q{a.key}",
                        )
                    except Exception:
                        assert a.quota is not None
                        await self._run(a, a.quota.unreachable())
                case Admit():
                    del self.admissions[a.key]
                    await self._start(a)
                case Refuse(message, wait, ticket):
                    del self.admissions[a.key]
                    a.handle.span.set_status(Status(StatusCode.ERROR, "rate_limited"))
                    body = InferReply(
                        ok=False,
                        error=ErrorBody(code="rate_limited", message=message),
                        model_id=a.model_id,
                        request_id=a.request_id,
                        retry_after_s=wait,
                        quota_ticket=ticket,
                    )
                    await a.handle.error("rate_limited", message, retry_after_s=wait, body=body)
