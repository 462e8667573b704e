"""What a router knows and how it chooses: the snapshots behind every decision.

Holds the latest plan (KV watch; the revision is the epoch) and telemetry snapshot
(KV watch), the shared circuit breakers (:class:`BreakerView`) and this router's own
short-lived suspicions of nodes it just saw fail, and folds them into a core
:class:`SwarmState` and :class:`Router` on every change. Choosing a route for a new
request happens here; carrying the request out is the router service's job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

import msgspec
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.core import (
    FailoverOptions,
    NodeState,
    NoHealthyPipeline,
    Recovered,
    Route,
    Router,
    RoutingRequest,
    SwarmPlan,
    SwarmState,
    Unrecoverable,
    failover_in_swarm,
    route_request,
)
from hecate.services.breakers import BreakerView
from hecate.wire import subjects
from hecate.wire.messages import TelemetrySnapshot

_plan = msgspec.json.Decoder(SwarmPlan)
_telemetry = msgspec.json.Decoder(TelemetrySnapshot)


class SwarmView:
    def __init__(
        self,
        *,
        failover: FailoverOptions,
        suspect_s: float,
        stale_s: float,
        log: logging.Logger,
    ) -> None:
        self.failover = failover
        self.suspect_s = suspect_s
        self.stale_s = stale_s
        self.log = log
        self.plan: SwarmPlan | None = None
        self.epoch = 0
        self.plan_at = 0.0
        self.telemetry: TelemetrySnapshot | None = None
        self.telemetry_at = 0.0
        self.suspects: dict[str, float] = {}  # node -> wall time we saw it fail
        self.breakers: BreakerView | None = None
        self.router: Router | None = None
        self.unsuspected: SwarmState | None = None
        self._rescues: tuple[SwarmState | None, dict[str, Recovered | None]] = (None, {})

    def suspect(self, node_id: str) -> None:
        """Steer new requests away from a node that just failed a stage."""
        self.suspects[node_id] = time.time()
        self.rebuild()

    def expire_suspicions(self) -> None:
        """Suspicions lapse even when no snapshot arrives to clear them."""
        if self.suspects and time.time() - min(self.suspects.values()) > self.suspect_s:
            self.rebuild()

    def freshness(self) -> dict[str, object]:
        now = time.time()
        plan_age = now - self.plan_at if self.plan else None
        tel_age = now - self.telemetry_at if self.telemetry else None
        return {
            "plan_epoch": self.epoch,
            "plan_age_s": plan_age,
            "telemetry_age_s": tel_age,
            "snapshot": "missing"
            if self.plan is None or self.telemetry is None
            else ("stale" if (tel_age or 0) > self.stale_s else "fresh"),
            "suspects": sorted(self.suspects),
        }

    async def follow_plan(self, nc: Client) -> None:
        kv = await kvs.wait_bucket(nc, subjects.PLAN_BUCKET)
        async for value, revision in kvs.watch(kv, subjects.PLAN_KEY):
            if value is None:
                continue
            try:
                plan = _plan.decode(value)
            except msgspec.DecodeError as exc:
                event(self.log, "bad plan ignored", logging.ERROR, error=str(exc))
                continue
            self.plan = msgspec.structs.replace(plan, epoch=revision)  # revision is the epoch
            self.epoch, self.plan_at = revision, time.time()
            self.rebuild()
            event(self.log, "plan adopted", epoch=revision, pipelines=len(plan.pipelines))

    async def follow_telemetry(self, nc: Client) -> None:
        kv = await kvs.wait_bucket(nc, subjects.TELEMETRY_BUCKET)
        async for value, _revision in kvs.watch(kv, subjects.TELEMETRY_KEY):
            if value is None:
                continue
            try:
                self.telemetry = _telemetry.decode(value)
            except msgspec.DecodeError as exc:
                event(self.log, "bad telemetry ignored", logging.ERROR, error=str(exc))
                continue
            self.telemetry_at = time.time()
            self.rebuild()

    def rebuild(self) -> None:
        """Plan + telemetry + local suspicions -> a fresh core snapshot."""
        if self.plan is None:
            return
        now = time.time()
        seen = self.telemetry.nodes if self.telemetry else {}
        nodes: dict[str, NodeState] = {}
        plain: dict[str, NodeState] = {}
        for profile in self.plan.nodes:
            t = seen.get(profile.node_id)
            state = (
                NodeState()
                if t is None
                else NodeState(
                    alive=t.alive and not t.draining,
                    latency_ms=t.latency_ms,
                    load=t.load,
                    score=t.score,
                    last_seen=t.last_seen,
                    in_flight=t.in_flight,
                )
            )
            if self.breakers is not None and not self.breakers.admits(profile.node_id):
                state = msgspec.structs.replace(state, alive=False)  # its circuit is open
            plain[profile.node_id] = state
            suspected = self.suspects.get(profile.node_id)
            if suspected is not None:
                heard_since = t is not None and t.alive and (t.last_seen or 0) > suspected
                if heard_since or now - suspected > self.suspect_s:
                    del self.suspects[profile.node_id]
                else:
                    state = msgspec.structs.replace(state, alive=False)
            nodes[profile.node_id] = state
        snapshot = SwarmState(self.plan, nodes)
        # What telemetry alone says: suspicion is a hint that steers traffic away from a
        # node we just saw fail, never a reason to refuse a model telemetry calls healthy.
        self.unsuspected = SwarmState(self.plan, plain) if self.suspects else snapshot
        if self.router is None:
            self.router = Router(snapshot)
        else:
            self.router.update(snapshot)

    def choose(
        self, model_id: str, request: RoutingRequest, full: Collection[str] = ()
    ) -> tuple[Route, bool, set[str]]:
        """The route for a new request, whether it is degraded, and the half-open
        targets whose probe it carries (see :meth:`take`).

        The cheapest intact pipeline (counting this router's in-flight work); when none
        is intact, the best rescue the core finds for a broken one (a per-layer splice,
        else the reserve model if allowed); when nothing is found and the only obstacle
        is this router's own suspicion, what telemetry alone says. Pipelines in ``full``
        are at their admission limit: when only those are healthy, :class:`Saturated`
        is raised (load is a reason to wait, never to splice or degrade).
        """
        assert self.router is not None
        route, degraded = self._choose_route(model_id, request, full)
        return route, degraded, self.take(route)

    def saturated(self, model_id: str, full: Collection[str]) -> bool:
        """Every healthy pipeline of ``model_id`` is in ``full`` (and there is one): a
        request for it now would wait for room."""
        assert self.router is not None
        r = self.router
        table = r.state.cost_table(model_id, r.weights, r.penalty)
        return bool(table) and all(pid in full for _cost, pid, _p in table)

    def rescue(
        self, route: Route, lost_node: str, request: RoutingRequest
    ) -> Recovered | Unrecoverable:
        """The failover of a request in flight after ``lost_node`` failed it. Whoever
        sends the request along the rescue route passes it to :meth:`take` first."""
        assert self.router is not None
        return failover_in_swarm(
            route, lost_node, self.router.state, self.failover, request=request
        )

    def take(self, route: Route) -> set[str]:
        """A request is about to be sent along ``route``: the probe lease this router
        holds for any target on it is spent. Every route a request is sent along, first
        or rescue, goes through here, so a half-open target gets exactly one probe."""
        if self.breakers is None:
            return set()
        taken = self.breakers.took(route.node_ids)
        if taken:
            self.rebuild()  # the probe is out: block the target again until it reports
        return taken

    def _choose_route(
        self, model_id: str, request: RoutingRequest, full: Collection[str]
    ) -> tuple[Route, bool]:
        assert self.router is not None
        try:
            return self.router.route(model_id, request, full), False
        except NoHealthyPipeline:
            rescue = self._rescue(model_id, request)
            if rescue is not None:
                return rescue.route, rescue.degraded
            if not self.suspects or self.unsuspected is None:
                raise
            return route_request(model_id, request, self.unsuspected), False

    def _rescue(self, model_id: str, request: RoutingRequest) -> Recovered | None:
        """Rescue routes are computed once per snapshot and model, not per request."""
        assert self.router is not None
        state = self.router.state
        if self._rescues[0] is not state:
            self._rescues = (state, {})
        cache = self._rescues[1]
        if model_id not in cache:
            found: list[Recovered] = []
            for p in state.plan.pipelines_of(model_id):
                dead = next((s.node_id for s in p.stages if not state.is_alive(s.node_id)), None)
                if dead is None:
                    continue
                broken = Route(
                    model_id=model_id, pipeline_id=p.pipeline_id, cost=0.0, stages=p.stages
                )
                result = failover_in_swarm(broken, dead, state, self.failover, request=request)
                if isinstance(result, Recovered):
                    found.append(result)
            cache[model_id] = min(
                found, key=lambda r: (r.degraded, r.route.cost, r.route.pipeline_id), default=None
            )
        return cache[model_id]

    def layers(self, model_id: str) -> int:
        assert self.plan is not None
        m = self.plan.model(model_id)
        return m.layers if m is not None else 0
