"""A router's breaker reports on their way to the breaker service.

Core NATS keeps nothing for a subscriber that is not there. While the router is
disconnected, and for a grace period after it reconnects (the breaker service may not
have resubscribed yet), reports wait in a bounded :class:`~hecate.bus.backlog.Backlog`
and are delivered in batches whose delivery is checked: each is published with a reply
subject of its own, so one nobody heard comes back as a no-responders status, and stays
for the next try. A report that cannot be kept (the backlog is full, or it is older than
the breaker's window) is counted in the router's ``breaker_reports_dropped`` and logged
at WARNING.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from nats.aio.client import Client

from hecate.bus.backlog import Backlog, Held
from hecate.bus.logs import event
from hecate.bus.service import NO_RESPONDERS, encode
from hecate.wire import subjects
from hecate.wire.messages import OutcomeReport


class ReportOutbox:
    def __init__(
        self,
        connection: Callable[[], Client],
        *,
        log: logging.Logger,
        counters: Counter[str],
        backlog: Backlog,
        reconnect_grace_s: float,
    ) -> None:
        self._connection = connection
        self.log = log
        self.counters = counters
        self.backlog = backlog
        self.reconnect_grace_s = reconnect_grace_s
        self._reconnects = 0  # the connection's reconnect count when last looked at
        self._unsure_until = 0.0  # monotonic: until then, reports go through the backlog
        self._delivering = False
        self._retry_at = 0.0  # monotonic: the next delivery attempt after one bounced
        self._backoff_s = 0.0
        self._dropped_since_delivery: Counter[str] = Counter()  # target -> reports

    @property
    def nc(self) -> Client:
        return self._connection()

    async def send(self, report: OutcomeReport) -> None:
        """Publish ``report``, or keep it when it might reach nobody (or others wait)."""
        if self._unsure() or len(self.backlog):  # behind the backlog: keep their order
            self._keep(report)
            return
        try:
            await self.nc.publish(subjects.breaker_report(report.target), encode(report))
        except Exception as exc:  # disconnected meanwhile: keep it for the reconnect
            event(self.log, "breaker report kept", logging.DEBUG, error=repr(exc))
            self._keep(report)

    def _unsure(self) -> bool:
        """Whether a plain publish might reach nobody: disconnected, or so recently
        reconnected that the breaker service may not be subscribed again yet."""
        reconnects = int(self.nc.stats.get("reconnects", 0))
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            self._unsure_until = time.monotonic() + self.reconnect_grace_s
        return not self.nc.is_connected or time.monotonic() < self._unsure_until

    def _keep(self, report: OutcomeReport) -> None:
        self.counters["breaker_reports_kept"] += 1
        self._dropped(self.backlog.hold(report, time.monotonic()), "backlog full")

    def _dropped(self, held: list[Held], why: str) -> None:
        if not held:
            return
        reports = [h.report for h in held]
        self.counters["breaker_reports_dropped"] += len(reports)
        first = not self._dropped_since_delivery
        self._dropped_since_delivery.update(r.target for r in reports)
        if first:  # once per outage here; the total when the backlog is delivered
            event(
                self.log,
                "breaker reports dropped",
                logging.WARNING,
                why=why,
                dropped=len(reports),
                targets=sorted({r.target for r in reports}),
                codes=sorted({r.code or ("ok" if r.ok else "failure") for r in reports}),
            )

    def redeliver(self, spawn: Callable[[Awaitable[None]], object]) -> None:
        """Called on every tick of the router's sweep: start delivering the backlog when
        connected (one delivery at a time, backing off while nobody hears it)."""
        if (
            len(self.backlog)
            and not self._delivering
            and self.nc.is_connected
            and time.monotonic() >= self._retry_at
        ):
            self._delivering = True
            spawn(self._deliver_in_background())

    async def _deliver_in_background(self) -> None:
        await self.deliver()

    async def deliver(self) -> int:
        """Publish the backlog, each report with a reply subject of its own: a report no
        breaker service heard comes back as a no-responders status and goes back in the
        backlog. Returns how many were heard.

        A delivery cut short by a disconnect puts the whole batch back: some of it may
        then reach the breaker twice (a failure counted twice), never zero times
        unnoticed."""
        try:
            self._dropped(self.backlog.expired(time.monotonic()), "older than the breaker window")
            batch = self.backlog.take()
            if not batch:
                return 0
            try:
                bounced = await self._publish_checked([h.report for h in batch])
            except Exception as exc:
                event(self.log, "breaker reports not delivered", logging.DEBUG, error=repr(exc))
                bounced = set(range(len(batch)))
            back = [h for i, h in enumerate(batch) if i in bounced]
            self._dropped(self.backlog.put_back(back), "backlog full")
            heard = len(batch) - len(back)
            self.counters["breaker_reports_redelivered"] += heard
            if back:
                self._backoff_s = min(max(2 * self._backoff_s, 0.05), 2.0)
                self._retry_at = time.monotonic() + self._backoff_s
            else:
                self._backoff_s = 0.0
                self._retry_done()
            if heard:
                event(self.log, "breaker reports delivered", delivered=heard, waiting=len(back))
            return heard
        finally:
            self._delivering = False

    def _retry_done(self) -> None:
        if self._dropped_since_delivery:
            event(
                self.log,
                "breaker reports dropped",
                logging.WARNING,
                why="summary of the outage",
                dropped=sum(self._dropped_since_delivery.values()),
                targets=dict(self._dropped_since_delivery),
            )
            self._dropped_since_delivery.clear()

    async def _publish_checked(self, batch: list[OutcomeReport]) -> set[int]:
        """The indexes of the reports in ``batch`` that no subscriber heard."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(f"{inbox}.*")
        try:
            for i, report in enumerate(batch):
                await self.nc.publish(
                    subjects.breaker_report(report.target), encode(report), reply=f"{inbox}.{i}"
                )
            # The server sends no-responders statuses in the order of the publishes, but
            # not before its PONG (a flush proves nothing): a last publish to a subject
            # nobody can hear bounces after every earlier bounce, so once its own status
            # is back, a report with none was heard.
            await self.nc.publish(f"{inbox}.unheard.end", b"", reply=f"{inbox}.end")
            bounced: set[int] = set()
            while True:
                msg = await sub.next_msg(timeout=2.0)
                token = msg.subject.rsplit(".", 1)[-1]
                if token == "end":
                    return bounced
                if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
                    bounced.add(int(token))
        finally:
            await sub.unsubscribe()

    def close(self) -> None:
        """Whatever is still kept will never be delivered: count and log it."""
        self._dropped(self.backlog.take(), "router stopped")
        self._retry_done()
