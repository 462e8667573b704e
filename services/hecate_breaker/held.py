"""Breaker reports the bucket could not take yet, retried in arrival order.

The breaker service holds a report it cannot apply now (the bucket unreachable, or
every compare-and-set round lost) rather than lose it, and applies the held ones oldest
first, backing off while the bucket stays away. A report held past the failure window,
or pushed out of a full backlog, is dropped, counted and logged: landing that late it
would be counted as a fresh failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from hecate.bus.backlog import Backlog, Held
from hecate.bus.logs import event
from hecate.wire.messages import OutcomeReport

MAX_HELD = 10_000
RETRY_MIN_S = 0.05
RETRY_MAX_S = 1.0


class HeldReports:
    def __init__(
        self,
        apply: Callable[[OutcomeReport], Awaitable[bool]],
        *,
        window_s: float,
        log: logging.Logger,
    ) -> None:
        """``apply`` folds one report into its circuit, False when it could not now."""
        self.apply = apply
        self.window_s = window_s
        self.log = log
        self.backlog = Backlog(max_age_s=window_s, max_len=MAX_HELD)
        self.dropped = 0
        self._retry = asyncio.Event()

    def hold(self, report: OutcomeReport, reason: str) -> None:
        if not len(self.backlog):  # the first of a spell; the counters carry the rest
            event(
                self.log,
                "breaker reports held",
                logging.WARNING,
                target=report.target,
                reason=reason,
            )
        for pushed_out in self.backlog.hold(report, time.monotonic()):
            self._drop(pushed_out, f"backlog full ({self.backlog.max_len} reports)")
        self._retry.set()

    def _drop(self, held: Held, reason: str) -> None:
        self.dropped += 1
        r = held.report
        event(
            self.log,
            "breaker report dropped",
            logging.WARNING,
            target=r.target,
            ok=r.ok,
            code=r.code,
            router=r.router_id,
            held_s=round(time.monotonic() - held.received, 3),
            reason=reason,
            dropped=self.dropped,
        )

    async def retry(self) -> None:
        """Apply held reports in arrival order, backing off while the bucket is away."""
        delay = RETRY_MIN_S
        while True:
            await self._retry.wait()
            applied = 0
            while len(self.backlog):
                for stale in self.backlog.expired(time.monotonic()):
                    self._drop(stale, f"held past the {self.window_s:g} s failure window")
                held = self.backlog.first()
                if held is None:
                    break
                if await self.apply(held.report):
                    self.backlog.pop()
                    applied += 1
                    delay = RETRY_MIN_S
                    continue
                await asyncio.sleep(delay)
                delay = min(2 * delay, RETRY_MAX_S)
            if applied:
                event(self.log, "held breaker reports applied", applied=applied)
            self._retry.clear()
