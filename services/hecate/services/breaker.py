"""breaker: one circuit breaker per target, shared by every router.

Listens: ``hecate.breaker.report.<target>`` (OutcomeReport from routers).
Holds: the resilience core's :class:`CircuitBreaker` per target, on the wall clock (the
deadlines it writes are read by every router).
Answers: ``hecate.quota.acquire``, the shared per-tenant quota desk (see quotas.py).
Publishes: each target's :class:`BreakerSnapshot` in KV ``hecate-breakers/<target>``,
written with compare-and-set on the revision it read, and ``hecate.events.breaker`` on
every state change.

Routers watch the bucket, so an OPEN reaches all of them in milliseconds, and none
suffers the failures another already counted. The single HALF_OPEN probe is a lease:
a router that wants to probe writes ``probe_started`` with compare-and-set; exactly one
write succeeds whatever the number of routers, and the probe's outcome comes back here
as a report like any other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import msgspec
from nats.js.errors import KeyWrongLastSequenceError
from opentelemetry.trace import TracerProvider

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.bus.service import Service, encode
from hecate.resilience.breaker import BreakerConfig, BreakerSnapshot, CircuitBreaker
from hecate.services.quotas import QuotaConfig, QuotaDesk
from hecate.wire import subjects
from hecate.wire.messages import BreakerChanged, OutcomeReport, QuotaRequest

_snapshot = msgspec.json.Decoder(BreakerSnapshot)


class BreakerService:
    def __init__(
        self,
        *,
        instance_id: str,
        log: logging.Logger,
        tracer_provider: TracerProvider | None,
        failure_threshold: int = 5,
        window_s: float = 30.0,
        cooldown_s: float = 60.0,
        probe_timeout_s: float = 10.0,
        quotas: QuotaConfig | None = None,
    ) -> None:
        self.log = log
        self.config = BreakerConfig(
            failure_threshold=failure_threshold,
            window_s=window_s,
            cooldown_s=cooldown_s,
            probe_timeout_s=probe_timeout_s,
        )
        self.service = Service(
            kind="breaker",
            name=subjects.SERVICE_NAMES["breaker"],
            instance_id=instance_id,
            description="shared circuit breakers: one per target, state in KV",
            log=log,
            tracer_provider=tracer_provider,
            metadata={k: str(v) for k, v in msgspec.structs.asdict(self.config).items()},
        )
        self.trips = 0
        self.desk = QuotaDesk(quotas or QuotaConfig())

    async def run(self, url: str, stop: asyncio.Event) -> None:
        svc = self.service
        await svc.start(url)
        self._kv = await kvs.bucket(svc.nc, subjects.BREAKER_BUCKET)
        reports = await svc.add_endpoint(
            "report", subjects.BREAKER_REPORT_ALL, OutcomeReport, self._on_report
        )
        reports.status = lambda: {"trips": self.trips}
        quota = await svc.add_endpoint(
            "quota", subjects.QUOTA_ACQUIRE, QuotaRequest, self.desk.acquire
        )
        quota.status = lambda: {
            "refused": self.desk.refused,
            "tenants": sorted(self.desk.config.tenants),
        }
        await svc.ready()
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

    async def _on_report(self, report: OutcomeReport, _headers: Mapping[str, str]) -> None:
        for _ in range(5):  # a router may have taken the probe lease meanwhile: re-read
            try:
                entry = await self._kv.get(report.target)
                before = _snapshot.decode(entry.value) if entry.value else None
                revision = int(entry.revision or 0)
            except Exception:
                before, revision = None, 0
            breaker = self.breaker(before)
            if report.ok:
                breaker.record_success()
            else:
                breaker.record_failure(report.retry_after_s)
            after = breaker.snap
            if after == before or (before is None and after == BreakerSnapshot()):
                return
            try:
                if revision:
                    await self._kv.update(report.target, encode(after), last=revision)
                else:
                    await self._kv.create(report.target, encode(after))
            except (KeyWrongLastSequenceError, Exception) as exc:  # lost a CAS race: retry
                if (
                    not isinstance(exc, KeyWrongLastSequenceError)
                    and "wrong last" not in str(exc).lower()
                ):
                    event(self.log, "breaker write failed", logging.WARNING, error=repr(exc))
                continue
            old_state = before.state if before else "closed"
            if after.state != old_state:
                await self._changed(report, after, old_state)
            return

    async def _changed(self, report: OutcomeReport, after: BreakerSnapshot, old: str) -> None:
        if after.state == "open" and old == "closed":
            self.trips += 1
        reason = f"{'success' if report.ok else report.code or 'failure'} from {report.router_id}"
        event(
            self.log,
            f"breaker {after.state}",
            target=report.target,
            was=old,
            reason=reason,
            open_until=after.open_until,
        )
        change = BreakerChanged(
            target=report.target,
            state=after.state,
            open_until=after.open_until,
            reason=reason,
            at=time.time(),
        )
        await self.service.nc.publish(subjects.EVENT_BREAKER, encode(change))
