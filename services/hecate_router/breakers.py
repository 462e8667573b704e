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

A report that might reach nobody (this router disconnected, or just reconnected) is
kept and delivered later with its delivery checked, by the
:class:`~hecate_router.reports.ReportOutbox`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus.backlog import Backlog
from hecate.bus.logs import event
from hecate.bus.service import encode
from hecate.resilience.breaker import BreakerSnapshot
from hecate.wire import subjects
from hecate.wire.messages import OutcomeReport, ProbeGrant, ProbeRequest
from hecate_router.reports import ReportOutbox

PROBE_ASK_TIMEOUT_S = 1.0  # the breaker service's answer to a lease ask
PROBE_ASK_AGAIN_S = 1.0  # after an ask that got no answer

_snapshot = msgspec.json.Decoder(BreakerSnapshot)
_grant = msgspec.json.Decoder(ProbeGrant)


class BreakerView:
    def __init__(
        self,
        connection: Callable[[], Client],
        *,
        router_id: str,
        probe_timeout_s: float,
        log: logging.Logger,
        counters: Counter[str] | None = None,
        backlog: Backlog | None = None,
        reconnect_grace_s: float = 3.0,
    ) -> None:
        self._connection = connection  # the router's, once it is connected
        self.router_id = router_id
        self.probe_timeout_s = probe_timeout_s
        self.log = log
        self.snapshots: dict[str, tuple[BreakerSnapshot, int]] = {}
        self.leased: set[str] = set()  # won the probe lease; the next request may go
        self.probing: set[str] = set()  # the probe request is in flight
        self._tried: dict[str, int] = {}  # target -> revision a lease was answered on
        self._unanswered: dict[str, float] = {}  # target -> when an unanswered ask may go again
        self.leases_won = 0
        self.counters: Counter[str] = Counter() if counters is None else counters
        self.outbox = ReportOutbox(
            connection,
            log=log,
            counters=self.counters,
            backlog=Backlog(max_age_s=30.0, max_len=1000) if backlog is None else backlog,
            reconnect_grace_s=reconnect_grace_s,
        )

    @property
    def nc(self) -> Client:
        return self._connection()

    async def follow(self, on_change: Callable[[], None]) -> None:
        """Watch every target's state (latest first, then live updates), once the
        breaker service has created the bucket; ``on_change`` after each."""
        kv = await kvs.wait_bucket(self.nc, subjects.BREAKER_BUCKET)
        watcher = await kv.watchall()
        try:
            kvs.still_cancelled()  # its setup waits with asyncio.wait_for
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
                on_change()
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
            and self._unanswered.get(target, 0.0) <= now
            and target not in self.leased
            and target not in self.probing
        ]

    async def try_lease(self, target: str) -> bool:
        """Ask the breaker service for the probe: True for the one router granted it."""
        held = self.snapshots.get(target)
        if held is None:
            return False
        snap, revision = held
        now = time.time()
        if not self._probe_due(snap, now):
            return False
        ask = ProbeRequest(target=target, router_id=self.router_id)
        self._unanswered[target] = now + PROBE_ASK_TIMEOUT_S + PROBE_ASK_AGAIN_S  # while asking
        try:
            msg = await self.nc.request(
                subjects.BREAKER_PROBE, encode(ask), timeout=PROBE_ASK_TIMEOUT_S
            )
            granted = _grant.decode(msg.data).granted
        except Exception:  # no breaker service, an error reply, a timeout: no probe now
            # Asked again later, not on the next revision only: an ask the service never
            # heard changes nothing in the bucket, and the circuit would stay open for good.
            self._unanswered[target] = time.time() + PROBE_ASK_AGAIN_S
            return False
        self._unanswered.pop(target, None)
        self._tried[target] = revision  # answered: asked again once the state moves
        if not granted:
            return False
        self.leased.add(target)
        self.leases_won += 1
        event(self.log, "probe lease won", target=target)
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
        await self.outbox.send(report)

    # -- delivery of kept reports (see ReportOutbox) -------------------------------------

    @property
    def backlog(self) -> Backlog:
        return self.outbox.backlog

    def redeliver(self, spawn: Callable[[Awaitable[None]], object]) -> None:
        """Called on every tick of the router's sweep (see :meth:`ReportOutbox.redeliver`)."""
        self.outbox.redeliver(spawn)

    async def deliver(self) -> int:
        """Publish the kept reports now; how many were heard."""
        return await self.outbox.deliver()

    def close(self) -> None:
        """The router is stopping: whatever is still kept will never be delivered."""
        self.outbox.close()
