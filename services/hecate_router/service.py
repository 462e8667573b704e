"""router: ``hecate.infer.<model>`` in, an answer or an explicit error out. Always.

A thin shell. What happens to a request in flight is decided by its
:class:`~hecate_router.lifecycle.Lifecycle` (pure: events in, actions out); this file
turns bus messages into events and runs the actions (flightdeck.py).

Listens: ``hecate.infer.>`` in queue group ``hecate-routers`` (any number of replicas),
``hecate.router.cancel`` and ``hecate.router.retries`` (every replica),
``hecate.events.node.down``, and its own inbox for stage, quota and retry-claim replies.
Holds: a :class:`SwarmView` (plan, telemetry, breakers, suspicions, the chooser).
Admits: per pipeline only as many requests as its measured step times allow; the rest
wait in a per-tenant line, then get ``rate_limited`` with a Retry-After (admission.py),
after the shared quota desk when quotas are enforced (quotagate.py).

An infer request is answered through its deferred :class:`Request` handle, kept with
its flight until the lifecycle answers; stage replies are correlated by the integers in
their reply subject (``<flight>-<send>-<stage>``), and the lifecycle ignores any that
is not its current send.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping

from nats.aio.msg import Msg
from opentelemetry.trace import TracerProvider

from hecate.bus.logs import event
from hecate.bus.service import Service
from hecate.bus.settle import settled
from hecate.wire import subjects
from hecate.wire.messages import InferCancel, InferRequest, NodeEvent, RetryClaim, RetryOwner
from hecate_router.admission import AdmissionDesk
from hecate_router.breakers import BreakerView
from hecate_router.config import RouterConfig
from hecate_router.flightdeck import Flight, FlightDeck
from hecate_router.flow import Abort, Cancelled, NodeDown, Tick
from hecate_router.identity import Refused
from hecate_router.intake import Intake
from hecate_router.quotagate import Admission
from hecate_router.swarmview import SwarmView

__all__ = ["RouterConfig", "RouterService"]

PLAN_WAIT_S = 5.0  # how long a starting router waits for its first plan
SWEEP_S = 0.02  # how often stage deadlines, the line and probe leases are looked at


class RouterService:
    def __init__(
        self,
        config: RouterConfig,
        *,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.config = config
        self.instance_id = config.instance_id
        self.log = log
        self.service = svc = Service(
            kind="router",
            name=subjects.SERVICE_NAMES["router"],
            instance_id=config.instance_id,
            description="routes hecate.infer.<model> along the cheapest healthy pipeline",
            log=log,
            tracer_provider=tracer_provider,
            max_payload=config.max_request_bytes,
        )
        self.counters: Counter[str] = Counter()
        self.view = SwarmView(
            failover=config.failover, suspect_s=config.suspect_s, stale_s=config.stale_s, log=log
        )
        self.admission: AdmissionDesk[Admission] = AdmissionDesk(
            limits=config.limits,
            queue_limit=config.queue_limit,
            max_wait_s=config.queue_timeout_s,
            max_line_wait_s=max(config.queue_max_wait_s, config.queue_timeout_s),
        )
        self.deck = FlightDeck(svc, self.view, self.admission, config.flow(), self.counters)
        self.intake = Intake(svc, config, self.view, self.counters, self.admission, self.deck)

    @property
    def flights(self) -> dict[int, Flight]:
        return self.deck.flights

    async def run(self, url: str, stop: asyncio.Event, grace: float = 10.0) -> None:
        svc, view, intake = self.service, self.view, self.intake
        await svc.start(url)
        # Under the connection's inbox prefix (``_INBOX.<user>`` with credentials), the
        # only inboxes the NATS permissions let nodes and the breaker service answer.
        inbox = f"{svc.nc.new_inbox()}.{self.instance_id}"
        self.deck.inbox = intake.quotas.inbox = intake.retries.inbox = inbox
        await svc.nc.subscribe(f"{inbox}.*", cb=self._on_inbox)
        view.breakers = BreakerView(
            svc.nc,
            router_id=self.instance_id,
            probe_timeout_s=self.config.breaker_probe_timeout_s,
            log=self.log,
            on_change=view.rebuild,
            counters=self.counters,
            reconnect_grace_s=self.config.reconnect_grace_s,
        )
        svc.spawn(view.follow_plan(svc.nc))
        svc.spawn(view.follow_telemetry(svc.nc))
        svc.spawn(view.breakers.follow())
        svc.spawn(self._sweep())
        await svc.add_endpoint("retries", subjects.ROUTER_RETRIES, RetryClaim, self._on_claim)
        await svc.add_endpoint("node-down", subjects.EVENT_NODE_DOWN, NodeEvent, self._on_down)
        await svc.add_endpoint("cancel", subjects.ROUTER_CANCEL, InferCancel, self._on_cancel)
        # Into the queue group with a plan (one already in KV comes at once): a router
        # without one can only answer no_plan, and its callers pause before retrying, so
        # a restarted replica cost them seconds. Never longer than PLAN_WAIT_S: a swarm
        # without a planner is still told so.
        deadline = time.monotonic() + PLAN_WAIT_S
        while view.plan is None and time.monotonic() < deadline:
            await asyncio.sleep(SWEEP_S)
        for name, subject in (("stream", subjects.STREAM_ALL), ("infer", subjects.INFER_ALL)):
            stats = await svc.add_endpoint(
                name,
                subject,
                InferRequest,
                intake.on_infer,
                queue=subjects.ROUTER_QUEUE,
                deferred=True,
            )
        stats.status = self.status  # the router's, once: on the infer endpoint
        await svc.ready()
        await settled(svc.nc)
        event(self.log, "router ready", inbox=inbox)
        await stop.wait()
        # Drain: stop taking requests (inbound), let flights land, then close outbound.
        await svc.drain_inbound(grace)
        for waiting in list(self.admission.drain()):
            await intake.reject(waiting, "draining", "router stopped before the request found room")
        deadline = time.monotonic() + grace
        while self.flights and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for flight in list(self.flights.values()):
            stopped = Abort("draining", "router stopped before the answer", time.monotonic())
            await self.deck.feed(flight, stopped)
        if view.breakers is not None:
            if view.breakers.backlog and svc.nc.is_connected:
                await view.breakers.deliver()  # a last try for reports kept meanwhile
            view.breakers.close()
        await svc.stop(grace)

    def status(self) -> dict[str, object]:
        breakers = self.view.breakers
        return {
            **self.view.freshness(),
            "in_flight": len(self.flights),
            "breakers_open": sorted(
                t
                for t, (snap, _) in (breakers.snapshots.items() if breakers else ())
                if snap.state != "closed"
            ),
            "probe_leases_won": breakers.leases_won if breakers else 0,
            "admission": self.admission.status(),
            "counters": dict(self.counters),
        }

    # -- what the bus tells the flights ------------------------------------------------

    async def _on_inbox(self, msg: Msg) -> None:
        await self.deck.on_inbox(msg, quotas=self.intake.quotas, retries=self.intake.retries)

    async def _sweep(self) -> None:
        """Stage deadlines, held quota admissions, the line, probe leases due."""
        while True:
            await asyncio.sleep(SWEEP_S)
            view, now = self.view, time.monotonic()
            view.expire_suspicions()
            if view.breakers is not None:
                for target in view.breakers.due(time.time()):
                    self.service.spawn(view.breakers.lease(target))
            await self.intake.sweep(now)
            if view.breakers is not None:
                view.breakers.redeliver(self.service.spawn)
            for flight in [f for f in self.flights.values() if f.machine.due(now)]:
                await self.deck.feed(flight, Tick(now))

    async def _on_down(self, down: NodeEvent, _headers: object) -> None:
        """Telemetry declared a node dead: a stage already delivered to it will never be
        answered, so its flights fail over now rather than at their deadline."""
        now = time.monotonic()
        for flight in list(self.flights.values()):
            await self.deck.feed(flight, NodeDown(down.node_id, down.reason, now))

    async def _on_cancel(self, cancel: InferCancel, headers: Mapping[str, str]) -> None:
        """A caller gave up: its flight, if it runs here, is answered ``cancelled`` now
        and its nodes drop the session (else the intake remembers the cancel). A tenant
        cancels only its own requests: the tenant is settled as for a request."""
        tenant = self.intake.tenant(headers, cancel.tenant, subjects.ROUTER_CANCEL)
        if isinstance(tenant, Refused):
            return
        flight = self.intake.cancelled((tenant, cancel.request_id))
        if flight is not None:
            event(self.log, "cancelled", request_id=flight.machine.request_id)
            await self.deck.feed(flight, Cancelled(time.monotonic()))

    async def _on_claim(self, claim: RetryClaim, _headers: object) -> RetryOwner | None:
        """Another replica got a retry: if the original is (or was) ours, we answer it."""
        ident = (claim.tenant, claim.request_id)
        if await self.intake.retries.repeat(ident, claim.reply_to):
            return RetryOwner(router_id=self.instance_id)
        return None
