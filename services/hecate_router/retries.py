"""Idempotent retries on the bus: a client's retry (same tenant and request_id) never
runs twice. What is known of them is a pure :class:`RetryBook`; this shell joins a retry
to its running flight, sends a remembered answer again, and asks the other replicas on
``hecate.router.retries`` whether one of them owns a retry it has no record of. The
first attempt of a request pays nothing for any of this, except just after this
replica was frozen (GC, swap, SIGSTOP): what waited in its socket meanwhile may have
been hedged to, and run by, another replica (client/hedge.py), so for a moment every
request is asked about like a retry before it runs.

A joined retry is held until its flight lands, asked of neither the quota desk nor the
line: a flight holds at most ``max_joined`` of them, those that reached this replica
and those another replica handed over together, and one more is answered
``rate_limited`` at once (it is not run either: the request already runs).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable

import msgspec

from hecate.bus.service import Request, Service
from hecate.wire import subjects
from hecate.wire.errors import error_headers
from hecate.wire.messages import ErrorBody, InferReply, InferRequest, RetryClaim
from hecate_router.retrybook import (
    MAX_JOINED,
    REMEMBER_BYTES,
    Answered,
    Ident,
    RetryBook,
    Running,
)

Caller = Request[InferRequest] | str  # a retry that reached us, or another replica's reply_to
_json = msgspec.json.Encoder()
# A gap this long between two looks at the clock means the process stood still. Below
# the client's hedge floor (client/hedge.py FLOOR_S): a request that waited long enough
# to be hedged waited long enough to be doubted.
STALL_S = 0.2
DOUBT_S = 0.5  # how long after waking every request is asked about first
# A retry turned away from a full flight is told to come back soon: once the flight
# lands its answer is remembered, and sent again at no cost.
JOIN_FULL_RETRY_S = 1.0


class RetryLedger:
    def __init__(
        self,
        service: Service,
        *,
        counters: Counter[str],
        waiting: Callable[[int], int | None],
        join: Callable[[int, Caller], None],
        admit: Callable[[Request[InferRequest]], Awaitable[None]],
        remember: int = 10_000,
        remember_bytes: int = REMEMBER_BYTES,
        max_joined: int = MAX_JOINED,
        claim_s: float = 0.05,
    ) -> None:
        self.service = service
        self.counters = counters
        self._waiting = waiting  # retries a flight holds; None once it no longer runs
        self._join = join
        self.max_joined = max_joined
        self._admit = admit
        self.book: RetryBook[Request[InferRequest]] = RetryBook(
            remember=remember, remember_bytes=remember_bytes, claim_s=claim_s
        )
        self.inbox = ""  # the router's reply inbox, set when it starts
        self._awake: float | None = None  # the last time this replica looked at the clock
        self._doubt_until = 0.0

    def tick(self, now: float) -> None:
        """The replica is running at ``now`` (the sweep calls this every few ms)."""
        if self._awake is not None and now - self._awake > STALL_S:
            self.counters["stalls"] += 1
            self._doubt_until = now + DOUBT_S
        self._awake = now if self._awake is None else max(self._awake, now)

    def doubted(self, now: float) -> bool:
        """Whether a first attempt arriving now may have run elsewhere meanwhile."""
        self.tick(now)
        return now < self._doubt_until

    async def repeat(self, ident: Ident, caller: Caller) -> bool:
        """Join the running request (or say it holds enough retries already) or repeat
        its answer; False if it is not ours."""
        match self.book.lookup(ident):
            case Running(key) if (waiting := self._waiting(key)) is not None:
                if waiting >= self.max_joined:
                    self.counters["retries_refused_full"] += 1
                    await self._refuse_full(ident, caller, waiting)
                else:
                    self._join(key, caller)
                    self.counters["retries_joined"] += 1
                return True
            case Answered((body, headers)):
                self.counters["retries_answered_again"] += 1
                if isinstance(caller, Request):
                    await caller.respond(body, headers)
                elif caller:
                    await self.service.nc.publish(caller, body, headers=headers)
                return True
        return False

    async def _refuse_full(self, ident: Ident, caller: Caller, waiting: int) -> None:
        """The flight holds as many retries as it may: this one is told so, and when to
        come back, rather than held too."""
        retry = JOIN_FULL_RETRY_S
        why = (
            f"{waiting} retries of this request already wait for its answer; retry in {retry:.1f} s"
        )
        error = ErrorBody(code="rate_limited", message=why, retry_after_s=retry)
        if isinstance(caller, Request):
            model_id = subjects.model_from_infer_subject(caller.subject) or ""
            body = InferReply(
                ok=False,
                error=error,
                request_id=ident[1],
                model_id=model_id,
                retry_after_s=retry,
            )
            await caller.error("rate_limited", why, retry_after_s=retry, body=body)
        elif caller:  # another replica's retry: its client waits on this subject
            body = InferReply(ok=False, error=error, request_id=ident[1], retry_after_s=retry)
            headers = error_headers("rate_limited", why, retry)
            await self.service.nc.publish(caller, _json.encode(body), headers=headers)

    async def ask_owner(self, req: Request[InferRequest], ident: Ident) -> None:
        """A retry this replica has no record of: find its owner before running it."""
        n = self.book.claim(req, time.monotonic())
        claim = RetryClaim(tenant=ident[0], request_id=ident[1], reply_to=req.reply)
        await self.service.nc.publish(
            subjects.ROUTER_RETRIES, _json.encode(claim), reply=f"{self.inbox}.r{n}"
        )

    def handed_over(self, n: int) -> None:
        """The owner answered the client itself: this replica's copy is done."""
        req = self.book.owned(n)
        if req is not None:
            self.counters["retries_handed_over"] += 1
            req.span.end()

    async def sweep(self, now: float) -> None:
        for req in self.book.unclaimed(now):
            await self._admit(req)
