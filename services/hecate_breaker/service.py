"""breaker: one circuit breaker per target, shared by every router.

Listens: ``hecate.breaker.report.<target>`` (OutcomeReport from routers),
``hecate.breaker.probe`` (ProbeRequest: a router asks for the single probe) and
``hecate.events.node.up`` (NodeEvent: telemetry hears a node again).
Holds: the resilience core's :class:`CircuitBreaker` per target, on the wall clock (the
deadlines it writes are read by every router).
Answers: ``hecate.quota.acquire``, the shared per-tenant quota desk (see quotas.py).
Publishes: each target's :class:`BreakerSnapshot` in KV ``hecate-breakers/<target>``,
written with compare-and-set on the revision it read, and ``hecate.events.breaker`` on
every state change.

Routers watch the bucket, so an OPEN reaches all of them in milliseconds, and none
suffers the failures another already counted. The single HALF_OPEN probe is a lease
this service grants: it writes ``probe_started`` with compare-and-set and grants the
router whose request made the write; exactly one is granted whatever the number of
routers (or of breaker replicas), and the probe's outcome comes back here as a report
like any other. Nobody else writes breaker state (the NATS permissions in deploy/ say
so too).

A node that comes back is usable again at once, not after the cooldown, when what
opened its circuit was its silence: a trip whose cause (the code of the failure that
opened it, see :data:`SILENCE_CAUSES`) says the node did not answer, or could not be
reached, is revived by the node's next ``node.up``: the circuit turns half-open, so the
next router that asks gets the probe within its sweep. Half-open and not closed, because
a heartbeat proves the process is back, not that it serves (heartbeats are sent apart
from the compute that answers): one request tests it, and a failed probe re-opens the
circuit for a full cooldown. A circuit opened by errors the node itself answered
(``internal``, ``rate_limited`` with its Retry-After...) waits its cooldown out: the node
was alive when it failed, so hearing it again says nothing new. The revival is a
compare-and-set on the revision read, like every write here, so with several replicas
(each hears every ``node.up``) exactly one makes it; ``$SRV.STATS`` counts it as
``revived`` and the log says ``breaker half_open`` with the reason.

A missing key is a fresh, closed circuit; any other KV failure is not taken for one. A
report that cannot be applied now (the bucket unreachable, or five compare-and-set rounds
lost) is held and retried in arrival order; one held past the failure window, or pushed
out of a full backlog, is dropped, counted and logged. ``$SRV.STATS`` shows ``held``,
``dropped`` and ``kv_errors`` beside ``trips``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import msgspec
from opentelemetry.trace import TracerProvider

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.bus.service import Service, ServiceError, encode
from hecate.resilience.breaker import BreakerSnapshot, CircuitBreaker
from hecate.wire import subjects
from hecate.wire.messages import (
    BreakerChanged,
    NodeEvent,
    OutcomeReport,
    ProbeGrant,
    ProbeRequest,
    QuotaRequest,
)
from hecate_breaker.config import BreakerConfig
from hecate_breaker.held import HeldReports
from hecate_breaker.quotas import QuotaDesk
from hecate_breaker.store import BreakerStore, StateUnavailable

CAS_ROUNDS = 5
SILENCE_CAUSES = (
    "timeout",  # the router's stage timeout
    "publish_failed",  # the call never left the router
    "node_down",  # telemetry declared it dead while a call waited on it
    "no_responders",  # nobody subscribed on its subject
    "probe expired",  # the probe never reported: it went nowhere, or nowhere answered
    # As routers before typed failures wrote them (a bucket may still hold these).
    "node down",
    "no reply within",
    "no responders",
    "publish failed",
)
"""Causes of an opening (the failure kind a router reports, or the node's own error
code) that say the target did not answer at all: news that it is back undoes them."""


def opened_by_silence(snap: BreakerSnapshot) -> bool:
    return snap.state == "open" and snap.cause.startswith(SILENCE_CAUSES)


class BreakerService:
    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.log = log
        self.settings = config or BreakerConfig()
        self.config = self.settings.circuit()
        self.service = Service(
            kind="breaker",
            name=subjects.SERVICE_NAMES["breaker"],
            instance_id=self.settings.instance_id,
            description="shared circuit breakers: one per target, state in KV",
            log=log,
            tracer_provider=tracer_provider,
            metadata={k: str(v) for k, v in msgspec.structs.asdict(self.config).items()},
        )
        self.trips = 0
        self.revived = 0
        self.probes_granted = 0
        self.kv_errors = 0
        self.held = HeldReports(self._retry_apply, window_s=self.config.window_s, log=log)
        self.desk = QuotaDesk(self.settings.quotas)

    async def run(self, url: str, stop: asyncio.Event) -> None:
        svc = self.service
        await svc.start(url)
        self._store = BreakerStore(await kvs.bucket(svc.nc, subjects.BREAKER_BUCKET))
        reports = await svc.add_endpoint(
            "report", subjects.BREAKER_REPORT_ALL, OutcomeReport, self._on_report
        )
        reports.status = lambda: {
            "trips": self.trips,
            "revived": self.revived,
            "held": len(self.held.backlog),
            "dropped": self.held.dropped,
            "kv_errors": self.kv_errors,
        }
        probes = await svc.add_endpoint(
            "probe", subjects.BREAKER_PROBE, ProbeRequest, self._on_probe, concurrency=16
        )
        probes.status = lambda: {"granted": self.probes_granted}
        # No queue group: every replica hears every node.up; the compare-and-set lets
        # one of them write.
        await svc.add_endpoint("node-up", subjects.EVENT_NODE_UP, NodeEvent, self._on_node_up)
        quota = await svc.add_endpoint(
            "quota", subjects.QUOTA_ACQUIRE, QuotaRequest, self.desk.acquire
        )
        quota.status = lambda: {
            "refused": self.desk.refused,
            "tenants": sorted(self.desk.config.tenants),
        }
        await svc.ready()
        svc.spawn(self.held.retry())
        event(self.log, "breaker ready", logging.INFO, **msgspec.structs.asdict(self.config))
        await stop.wait()
        await svc.stop()

    def breaker(self, snapshot: BreakerSnapshot | None) -> CircuitBreaker:
        c = self.config
        return CircuitBreaker(
            c.failure_threshold,
            c.window_s,
            c.cooldown_s,
            c.probe_timeout_s,
            clock=time.time,
            max_open_s=c.max_open_s,
            snapshot=snapshot,
        )

    async def _on_probe(self, ask: ProbeRequest, _headers: Mapping[str, str]) -> ProbeGrant:
        """Grant the single probe of ``ask.target`` if its cooldown is over and nobody
        holds it (or the holder's probe expired): a compare-and-set of ``probe_started``.
        With the circuit unreadable, the asker gets an error (no probe), never "closed"."""
        try:
            return await self._probe(ask)
        except StateUnavailable as exc:
            self.kv_errors += 1
            event(self.log, "probe refused", logging.WARNING, target=ask.target, error=str(exc))
            raise ServiceError("internal", f"breaker state unavailable: {exc}") from None

    async def _probe(self, ask: ProbeRequest) -> ProbeGrant:
        for _ in range(CAS_ROUNDS):  # another replica or a report wrote meanwhile: re-read
            before, revision = await self._store.read(ask.target)
            if before is None or before.state == "closed":
                return ProbeGrant(target=ask.target, granted=False, state="closed")
            breaker = self.breaker(before)
            granted = breaker.allow() and breaker.snap.state == "half_open"
            after = breaker.snap
            if after != before and not await self._store.write(ask.target, after, revision):
                continue
            if after.state != before.state:
                reason = f"probe granted to {ask.router_id}" if granted else "probe expired"
                await self._changed(ask.target, after, before.state, reason)
            if granted:
                self.probes_granted += 1
                event(self.log, "probe granted", target=ask.target, router=ask.router_id)
            return ProbeGrant(target=ask.target, granted=granted, state=after.state)
        return ProbeGrant(target=ask.target, granted=False, state="open")

    async def _on_report(self, report: OutcomeReport, _headers: Mapping[str, str]) -> None:
        if len(self.held.backlog):  # older reports wait: they go first
            self.held.hold(report, "behind held reports")
            return
        try:
            if await self._apply(report):
                return
            reason = f"lost {CAS_ROUNDS} compare-and-set rounds"
        except StateUnavailable as exc:
            self.kv_errors += 1
            reason = str(exc)
        self.held.hold(report, reason)

    async def _apply(self, report: OutcomeReport) -> bool:
        """Fold ``report`` into its circuit: False when every compare-and-set round was
        lost. Raises :class:`StateUnavailable`."""
        for _ in range(CAS_ROUNDS):  # a probe may have been granted meanwhile: re-read
            before, revision = await self._store.read(report.target)
            breaker = self.breaker(before)
            if report.ok:
                breaker.record_success()
            else:
                breaker.record_failure(report.retry_after_s, report.code)
            after = breaker.snap
            if after == before or (before is None and after == BreakerSnapshot()):
                return True
            if not await self._store.write(report.target, after, revision):
                continue
            old_state = before.state if before else "closed"
            if after.state != old_state:
                outcome = "success" if report.ok else report.code or "failure"
                await self._changed(
                    report.target, after, old_state, f"{outcome} from {report.router_id}"
                )
            return True
        return False

    async def _on_node_up(self, up: NodeEvent, _headers: Mapping[str, str]) -> None:
        """A node is heard again: its circuit, if its silence opened it, is half-open now.
        With the bucket unreadable nothing is changed: the cooldown then runs its course."""
        try:
            await self._revive(up.node_id, up.reason)
        except StateUnavailable as exc:
            self.kv_errors += 1
            event(
                self.log, "revival not applied", logging.WARNING, target=up.node_id, error=str(exc)
            )

    async def _revive(self, target: str, why: str) -> bool:
        for _ in range(CAS_ROUNDS):  # a report or another replica wrote meanwhile: re-read
            before, revision = await self._store.read(target)
            if before is None or not opened_by_silence(before):
                return False
            breaker = self.breaker(before)
            if not breaker.revive():  # its cooldown is over already: the probe is due anyway
                return False
            if not await self._store.write(target, breaker.snap, revision):
                continue
            self.revived += 1
            await self._changed(
                target, breaker.snap, before.state, f"node back ({why}); opened by {before.cause}"
            )
            return True
        return False

    async def _retry_apply(self, report: OutcomeReport) -> bool:
        try:
            return await self._apply(report)
        except StateUnavailable:
            self.kv_errors += 1
            return False

    async def _changed(self, target: str, after: BreakerSnapshot, old: str, reason: str) -> None:
        if after.state == "open" and old == "closed":
            self.trips += 1
        event(
            self.log,
            f"breaker {after.state}",
            target=target,
            was=old,
            reason=reason,
            open_until=after.open_until,
        )
        change = BreakerChanged(
            target=target,
            state=after.state,
            open_until=after.open_until,
            reason=reason,
            at=time.time(),
        )
        await self.service.nc.publish(subjects.EVENT_BREAKER, encode(change))
