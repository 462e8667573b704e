"""Idempotent retries: a client's retry (same tenant and request_id) never runs twice.

On the replica that has the request: a retry that arrives while it runs joins it (it
gets the same answer), and one that arrives afterwards gets the answer again (the
last ``remember`` answers are kept). A retry (``attempt > 1``) that lands on another
replica, as queue groups pick at random, is first *claimed*: that replica asks every
router on ``hecate.router.retries``, the owner answers the client itself and says so,
and only if nobody claims it within ``claim_s`` does the asking replica run it. The
first attempt of a request pays nothing for any of this.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.msg import Msg

from hecate.bus.logs import event
from hecate.bus.service import Service
from hecate.wire import subjects
from hecate.wire.messages import RetryClaim, RetryOwner

Ident = tuple[str, str]  # (tenant, request_id)
_claim = msgspec.json.Decoder(RetryClaim)
_json = msgspec.json.Encoder()


class RetryLedger:
    def __init__(
        self,
        service: Service,
        *,
        router_id: str,
        counters: Counter[str],
        join: Callable[[int, str], bool],
        admit: Callable[[Msg], Awaitable[None]],
        remember: int = 10_000,
        claim_s: float = 0.05,
    ) -> None:
        self.service = service
        self.router_id = router_id
        self.counters = counters
        self._join = join
        self._admit = admit
        self.remember = remember
        self.claim_s = claim_s
        self.inbox = ""  # the router's reply inbox, set when it starts
        self.in_progress: dict[Ident, int] = {}  # -> flight key
        self.answered: OrderedDict[Ident, tuple[bytes, dict[str, str] | None]] = OrderedDict()
        self.pending: dict[int, tuple[Msg, float]] = {}  # claims awaiting an owner
        self._next = 0

    def started(self, ident: Ident, key: int) -> None:
        self.in_progress[ident] = key

    def finished(self, ident: Ident, body: bytes, headers: dict[str, str] | None) -> None:
        self.in_progress.pop(ident, None)
        self.answered[ident] = (body, headers)
        while len(self.answered) > self.remember:
            self.answered.popitem(last=False)

    async def repeat(self, ident: Ident, reply_to: str) -> bool:
        """Join the running request or repeat its answer; False if it is not ours."""
        key = self.in_progress.get(ident)
        if key is not None and self._join(key, reply_to):
            self.counters["retries_joined"] += 1
            return True
        done = self.answered.get(ident)
        if done is None:
            return False
        self.counters["retries_answered_again"] += 1
        if reply_to:
            await self.service.nc.publish(reply_to, done[0], headers=done[1])
        return True

    async def ask_owner(self, msg: Msg, ident: Ident, reply_to: str) -> None:
        """A retry this replica has no record of: find its owner before running it."""
        self._next += 1
        self.pending[self._next] = (msg, time.monotonic() + self.claim_s)
        claim = RetryClaim(tenant=ident[0], request_id=ident[1], reply_to=reply_to)
        await self.service.nc.publish(
            subjects.ROUTER_RETRIES, _json.encode(claim), reply=f"{self.inbox}.r{self._next}"
        )

    def handed_over(self, n: int) -> None:
        """The owner answered the client itself."""
        if self.pending.pop(n, None) is not None:
            self.counters["retries_handed_over"] += 1

    async def on_claim(self, msg: Msg) -> None:
        """Another replica got a retry: if the original is (or was) ours, handle it."""
        try:
            claim = _claim.decode(msg.data)
        except msgspec.DecodeError as exc:  # no router sends this: say so, count it
            self.counters["rejected_bad_claim"] += 1
            if self.counters["rejected_bad_claim"] == 1:
                event(self.service.log, "retry claim rejected", logging.WARNING, error=str(exc))
            await self.service.reply_error(msg.reply, "bad_request", f"retry claim: {exc}")
            return
        if await self.repeat((claim.tenant, claim.request_id), claim.reply_to) and msg.reply:
            await self.service.nc.publish(
                msg.reply, _json.encode(RetryOwner(router_id=self.router_id))
            )

    async def sweep(self, now: float) -> None:
        """Nobody claimed a retry in time: its original is gone; run it here."""
        for n, (msg, deadline) in list(self.pending.items()):
            if now >= deadline:
                del self.pending[n]
                await self._admit(msg)
