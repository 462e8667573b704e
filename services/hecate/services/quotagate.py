"""The router's side of tenant quotas: ask the shared desk, never block on the answer.

A request of a tenant waits here (an :class:`Admission`) while the breaker service's
quota desk decides; the answer comes back on the router's inbox like a stage reply.
Admitted: it starts. Refused: the caller gets a 429-style reply with its own slot
(``retry_after_s``, ``quota_ticket``, ``Retry-After`` headers). A tenant that prefers
holding is held until its slot, when the caller's ``max_wait_ms`` allows, then asks
again with its ticket. Without an answer from the desk the request is served:
availability first, and counted (``quota_unavailable``).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from nats.aio.msg import Msg
from opentelemetry.trace import Span, Status, StatusCode

from hecate.bus.service import NO_RESPONDERS, Service, error_headers
from hecate.wire import subjects
from hecate.wire.messages import ErrorBody, InferReply, InferRequest, QuotaReply, QuotaRequest

_quota_reply = msgspec.json.Decoder(QuotaReply)
_json = msgspec.json.Encoder()


def holds(wait_s: float, max_wait_ms: int) -> bool:
    """A tenant that prefers holding is held when its booked slot is within what the
    caller will wait (``max_wait_ms``), and refused with its ticket otherwise."""
    return wait_s * 1000 <= max_wait_ms


@dataclass(slots=True, eq=False)
class Admission:
    """A request waiting for the quota desk (or held until its booked slot)."""

    key: int
    request_id: str
    model_id: str
    reply_to: str
    request: InferRequest
    span: Span
    ticket: int | None = None
    deadline: float = math.inf
    wake_at: float | None = None


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
        """Ask the shared quota desk; the answer comes back on this router's inbox."""
        a.deadline = time.monotonic() + self.quota_timeout_s
        self.admissions[a.key] = a
        ask = QuotaRequest(tenant=a.request.tenant, tokens=a.request.max_tokens, ticket=a.ticket)
        try:
            await self.service.nc.publish(
                subjects.QUOTA_ACQUIRE, _json.encode(ask), reply=f"{self.inbox}.q{a.key}"
            )
        except Exception:
            await self._quota_unavailable(a)

    async def _quota_unavailable(self, a: Admission) -> None:
        # Availability over strictness: without the desk, serve (and count it).
        self.counters["quota_unavailable"] += 1
        self.admissions.pop(a.key, None)
        await self._start(a)

    async def on_reply(self, key: int, msg: Msg) -> None:
        a = self.admissions.get(key)
        if a is None:
            return None
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            return await self._quota_unavailable(a)
        try:
            reply = _quota_reply.decode(msg.data)
        except msgspec.DecodeError:
            return await self._quota_unavailable(a)
        if reply.admitted:
            del self.admissions[key]
            return await self._start(a)
        wait = reply.retry_after_s
        if reply.hold and holds(wait, a.request.max_wait_ms):
            # Held, not refused: ask again with the ticket when the booked slot comes.
            self.counters["quota_held"] += 1
            a.ticket = reply.ticket
            a.wake_at = time.monotonic() + wait
            a.deadline = math.inf
            return None
        del self.admissions[key]
        self.counters["quota_refused"] += 1
        a.span.set_status(Status(StatusCode.ERROR, "rate_limited"))
        a.span.end()
        message = (
            f"tenant {a.request.tenant!r} is over its quota; retry in {wait:.3f} s "
            "with the quota_ticket to claim the slot booked for you"
        )
        body = InferReply(
            ok=False,
            error=ErrorBody(code="rate_limited", message=message),
            model_id=a.model_id,
            request_id=a.request_id,
            retry_after_s=wait,
            quota_ticket=reply.ticket,
        )
        headers = error_headers("rate_limited", message, wait)
        if a.reply_to:
            await self.service.nc.publish(a.reply_to, _json.encode(body), headers=headers)
        return None

    async def sweep(self, now: float) -> None:
        for a in list(self.admissions.values()):
            if a.wake_at is not None and now >= a.wake_at:
                a.wake_at = None
                await self.ask(a)
            elif now > a.deadline:
                await self._quota_unavailable(a)
