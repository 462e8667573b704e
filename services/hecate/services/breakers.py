"""A router's view of the shared circuit breakers (KV ``hecate-breakers``).

The breaker service owns the state machines and is the only writer of the bucket;
every router watches it and stops sending to a target whose circuit is open. When a
circuit's cooldown is over, each router that notices asks the breaker service for the
probe (``hecate.breaker.probe``); the service grants it with a compare-and-set write
of ``probe_started``, so exactly one router sends exactly one request as the probe,
however many replicas there are.

Outcomes go back to the breaker service as reports. Failures are always reported;
successes only when they matter (a target with a failure streak, or the probe), so a
healthy swarm sends no extra message per request.

Core NATS keeps nothing for a subscriber that is not there. While this router is
disconnected, and for a grace period after it reconnects (the breaker service may not
have resubscribed yet), reports wait in a bounded :class:`~hecate.services.backlog.Backlog` and are
delivered in batches whose delivery is checked: each is published with a reply subject
of its own, so one nobody heard comes back as a no-responders status, and stays for the
next try. A report that cannot be kept (the backlog is
full, or it is older than the breaker's window) is counted in the router's
``breaker_reports_dropped`` and logged at WARNING.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.bus.service import NO_RESPONDERS, encode
from hecate.resilience.breaker import BreakerSnapshot
from hecate.services.backlog import Backlog, Held
from hecate.wire import subjects
from hecate.wire.messages import OutcomeReport, ProbeGrant, ProbeRequest

_snapshot = msgspec.json.Decoder(BreakerSnapshot)
_grant = msgspec.json.Decoder(ProbeGrant)


class BreakerView:
    def __init__(
        self,
        nc: Client,
        *,
        router_id: str,
        probe_timeout_s: float,
        log: logging.Logger,
        on_change: Callable[[], None],
        counters: Counter[str] | None = None,
        backlog: Backlog | None = None,
        reconnect_grace_s: float = 3.0,
    ) -> None:
        self.nc = nc
        self.router_id = router_id
        self.probe_timeout_s = probe_timeout_s
        self.log = log
        self.on_change = on_change
        self.snapshots: dict[str, tuple[BreakerSnapshot, int]] = {}
        self.leased: set[str] = set()  # won the probe lease; the next request may go
        self.probing: set[str] = set()  # the probe request is in flight
        self._tried: dict[str, int] = {}  # target -> revision a lease was attempted on
        self.leases_won = 0
        self.counters: Counter[str] = Counter() if counters is None else counters
        self.backlog = Backlog(max_age_s=30.0, max_len=1000) if backlog is None else backlog
        self.reconnect_grace_s = reconnect_grace_s
        self._reconnects = 0  # the connection's reconnect count when last looked at
        self._unsure_until = 0.0  # monotonic: until then, reports go through the backlog
        self._delivering = False
        self._retry_at = 0.0  # monotonic: the next delivery attempt after one bounced
        self._backoff_s = 0.0
        self._dropped_since_delivery: Counter[str] = Counter()  # target -> reports

    async def follow(self) -> None:
        """Watch every target's state (latest first, then live updates), once the
        breaker service has created the bucket."""
        kv = await kvs.wait_bucket(self.nc, subjects.BREAKER_BUCKET)
        watcher = await kv.watchall()
        try:
            async for entry in watcher:
                if entry is None or entry.key is None:
                    continue
                if not entry.value:
                    self.snapshots.pop(entry.key, None)
                else:
                    try:
                        snap = _snapshot.decode(entry.value)
                    except msgspec.DecodeError:
                        continue
                    self.snapshots[entry.key] = (snap, int(entry.revision or 0))
                self.on_change()
        finally:
            await watcher.stop()

    # -- decisions ---------------------------------------------------------------------

    def admits(self, target: str) -> bool:
        """May this router send traffic to ``target`` now? (A closed circuit, or the probe
        lease this router holds; an open circuit turns probe-able only through a lease.)"""
        held = self.snapshots.get(target)
        if held is None or held[0].state == "closed":
            return True
        return target in self.leased

    def _probe_due(self, snap: BreakerSnapshot, now: float) -> bool:
        if snap.state == "open":
            return now >= snap.open_until
        if snap.state == "half_open":
            return snap.probe_started is None or now - snap.probe_started >= self.probe_timeout_s
        return False

    def due(self, now: float) -> list[str]:
        """Targets whose probe is due and that this router has not tried for yet."""
        return [
            target
            for target, (snap, revision) in self.snapshots.items()
            if self._probe_due(snap, now)
            and self._tried.get(target) != revision
            and target not in self.leased
            and target not in self.probing
        ]

    async def lease(self, target: str) -> None:
        await self.try_lease(target)

    async def try_lease(self, target: str) -> bool:
        """Ask the breaker service for the probe: True for the one router granted it."""
        held = self.snapshots.get(target)
        if held is None:
            return False
        snap, revision = held
        self._tried[target] = revision
        if not self._probe_due(snap, time.time()):
            return False
        ask = ProbeRequest(target=target, router_id=self.router_id)
        try:
            msg = await self.nc.request(subjects.BREAKER_PROBE, encode(ask), timeout=1.0)
            granted = _grant.decode(msg.data).granted
        except Exception:  # no breaker service, an error reply, a timeout: no probe
            return False
        if not granted:
            return False
        self.leased.add(target)
        self.leases_won += 1
        event(self.log, "probe lease won", target=target)
        self.on_change()
        return True

    def took(self, nodes: tuple[str, ...]) -> set[str]:
        """A request was routed through ``nodes``: a leased target now has its probe.
        Returns those targets (the request carries their probe until it reports)."""
        used = self.leased.intersection(nodes)
        if used:
            self.leased -= used
            self.probing |= used
        return used

    def abandon(self, targets: set[str]) -> None:
        """The request carrying these targets' probe will not reach them (rerouted
        around them, or answered otherwise): nothing will report, so stop waiting for
        it. The breaker service grants the probe again once its probe timeout passes."""
        dropped = self.probing & targets
        if dropped:
            self.probing -= dropped
            event(self.log, "probe abandoned", targets=sorted(dropped))

    # -- reports -----------------------------------------------------------------------

    async def report(
        self, target: str, *, ok: bool, code: str = "", retry_after_s: float | None = None
    ) -> None:
        held = self.snapshots.get(target)
        was_probe = target in self.probing
        self.probing.discard(target)
        if (
            ok
            and not was_probe
            and (held is None or (held[0].state == "closed" and not held[0].failures))
        ):
            return  # nothing to reset: spare the bus a message per request
        report = OutcomeReport(
            target=target,
            ok=ok,
            code=code,
            retry_after_s=retry_after_s,
            router_id=self.router_id,
            at=time.time(),
        )
        if self._unsure() or len(self.backlog):  # behind the backlog: keep their order
            self._keep(report)
            return
        try:
            await self.nc.publish(subjects.breaker_report(target), encode(report))
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

    # -- delivery of kept reports --------------------------------------------------------

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
        """The router is stopping: whatever is still kept will never be delivered."""
        self._dropped(self.backlog.take(), "router stopped")
        self._retry_done()
