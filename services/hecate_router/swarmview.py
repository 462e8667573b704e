"""What a router knows: the snapshots behind every decision, and the shell around the
chooser that makes them.

Holds the latest plan (the router follows its KV key; the revision is the epoch), the
latest telemetry snapshot and the shared circuit breakers (:class:`BreakerView`), and
feeds them, with this router's own suspicions, to a
:class:`~hecate.core.chooser.Chooser` on every change, and the time each step of a
request took as the router timed it, as it lands.
Every decision (usable nodes, the route of a new request, the rescue of one in flight,
whether admission must wait) is the chooser's; choosing here is only passing it the
clock. Carrying the request out is the router service's job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

import msgspec

from hecate.bus.logs import event
from hecate.core import (
    FailoverOptions,
    Recovered,
    Route,
    Router,
    RoutingRequest,
    SwarmPlan,
    Unrecoverable,
)
from hecate.core.chooser import Chooser
from hecate.core.kinds import ExecutorKind, keeps_sessions
from hecate.wire.messages import TelemetrySnapshot
from hecate_router.breakers import BreakerView
from hecate_router.fold import telemetry_nodes

# Telemetry that moves nobody up or down is built into the routes at most this often.
REBUILD_EVERY_S = 0.05
# And routine rebuilds (figures moved, nobody up or down) take at most this share of a
# router's time: a large swarm's rebuild (2 µs a node) comes less often than every
# REBUILD_EVERY_S, so following it never takes a router's core.
REBUILD_SHARE = 0.1


class SwarmView:
    def __init__(
        self,
        *,
        failover: FailoverOptions,
        suspect_s: float,
        stale_s: float,
        log: logging.Logger,
        breakers: BreakerView | None = None,
    ) -> None:
        self.chooser = Chooser(failover, suspect_s=suspect_s)
        self.stale_s = stale_s
        self.log = log
        self.plan: SwarmPlan | None = None
        self._kinds: dict[str, ExecutorKind] = {}  # per model, read once per plan
        self._firsts: dict[str, dict[str, str]] = {}  # per model, each pipeline's first node
        self.epoch = 0
        self.plan_at = 0.0
        self.telemetry: TelemetrySnapshot | None = None
        self.telemetry_at = 0.0  # when the latest snapshot came in: our wall clock...
        self.telemetry_heard = 0.0  # ...and our monotonic one
        self.breakers = breakers
        self._rebuilt = -REBUILD_EVERY_S  # monotonic time of the last rebuild
        self._rebuild_s = 0.0  # how long it took
        self._behind = False  # telemetry adopted since then and not built in

    @property
    def router(self) -> Router | None:
        """The chooser's router: the folded snapshot and this router's in-flight work."""
        return self.chooser.router

    @property
    def suspects(self) -> dict[str, float]:
        return self.chooser.suspects  # node -> wall time we saw it fail

    def suspect(self, node_id: str) -> None:
        """Steer new requests away from a node that just failed a stage."""
        self.chooser.suspect(node_id, time.time())
        self.rebuild()

    def measured(self, pipeline_id: str, seconds: float) -> None:
        """A step along ``pipeline_id`` (one pass, or one decode step) took ``seconds``
        as this router timed it: what the pipeline's links cost, for the next choice."""
        self.chooser.measured(pipeline_id, seconds, time.time())

    def expire_suspicions(self) -> None:
        """Suspicions lapse even when no snapshot arrives to clear them."""
        if self.chooser.lapsed(time.time()):
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
            # Requests sent to an unmeasured pipeline to measure it (Router.explore):
            # why a pipeline the cost model passes over still carries a few.
            "explored": self.router.explored if self.router is not None else 0,
        }

    def adopt_plan(self, plan: SwarmPlan, revision: int, wall: float) -> None:
        """A plan came in: its KV revision is its epoch."""
        self.plan = msgspec.structs.replace(plan, epoch=revision)
        self._kinds = {m.model_id: k for m in plan.models if (k := plan.executor_kind(m.model_id))}
        self._firsts = {}
        for p in plan.pipelines:
            if p.stages:
                self._firsts.setdefault(p.model_id, {})[p.pipeline_id] = p.stages[0].node_id
        self.epoch, self.plan_at = revision, wall
        self.rebuild()
        event(self.log, "plan adopted", epoch=revision, pipelines=len(plan.pipelines))

    def adopt_telemetry(
        self,
        snapshot: TelemetrySnapshot,
        wall: float,
        now: float,
        part: TelemetrySnapshot | None = None,
    ) -> None:
        """A telemetry snapshot came in, at ``wall`` (and ``now``, monotonic): the merge
        of every shard, ``part`` being the shard that just changed. The routes are
        rebuilt at once when ``part`` moves a node up or down (or when there is no
        ``part`` to tell), otherwise at most every :data:`REBUILD_EVERY_S`: with many
        telemetry replicas each writing ten times a second, a rebuild per snapshot
        would cost a router more than it routes (:meth:`catch_up` does the rest)."""
        before = self.telemetry.nodes if self.telemetry is not None else {}
        self.telemetry = snapshot
        self.telemetry_at, self.telemetry_heard = wall, now
        moved = part is None or any(
            (was := before.get(i)) is None or was.alive != t.alive for i, t in part.nodes.items()
        )
        if moved or now - self._rebuilt >= self.rebuild_every():
            self.rebuild()
        else:
            self._behind = True

    def catch_up(self, now: float) -> None:
        """Rebuild with the telemetry :meth:`adopt_telemetry` held back, once it is due."""
        if self._behind and now - self._rebuilt >= self.rebuild_every():
            self.rebuild()

    def rebuild_every(self) -> float:
        """How often figures alone may rebuild the routes: every
        :data:`REBUILD_EVERY_S`, or less often when a rebuild takes more than
        :data:`REBUILD_SHARE` of that."""
        return max(REBUILD_EVERY_S, self._rebuild_s / REBUILD_SHARE)

    def rebuild(self) -> None:
        """Plan + telemetry + circuits + local suspicions -> the chooser's fresh snapshot."""
        started = time.monotonic()
        self._behind, self._rebuilt = False, started
        if self.plan is None:
            return
        self._build(self.plan)
        self._rebuild_s = time.monotonic() - started

    def _build(self, plan: SwarmPlan) -> None:
        """The chooser's fresh snapshot, from what this view holds."""
        nodes, heard = telemetry_nodes(self.telemetry.nodes if self.telemetry else {})
        open_circuits: set[str] = set()
        leased: set[str] = set()
        if self.breakers is not None:
            open_circuits = {
                target
                for target, (snap, _revision) in self.breakers.snapshots.items()
                if snap.state != "closed"
            }
            leased = self.breakers.leased
        self.chooser.observe(
            plan,
            nodes,
            now=time.time(),
            open_circuits=open_circuits,
            leased=leased,
            heard=heard,
        )

    def choose(
        self, model_id: str, request: RoutingRequest, full: Collection[str] = ()
    ) -> tuple[Route, bool, set[str]]:
        """The route for a new request, whether it is degraded, and the half-open
        targets whose probe it carries (see :meth:`take`). The decision is
        :meth:`Chooser.choose`'s: the cheapest intact pipeline, else the best rescue of a
        broken one, else what telemetry alone says when only suspicion is in the way;
        :class:`Saturated` when only pipelines in ``full`` are intact."""
        route, degraded = self.chooser.choose(model_id, request, full, now=time.time())
        return route, degraded, self.take(route)

    def saturated(self, model_id: str, full: Collection[str]) -> bool:
        """Every healthy pipeline of ``model_id`` is in ``full`` (and there is one): a
        request for it now would wait for room."""
        return self.chooser.saturated(model_id, full)

    def rescue(
        self, route: Route, lost_node: str, request: RoutingRequest
    ) -> Recovered | Unrecoverable:
        """The failover of a request in flight after ``lost_node`` failed it. Whoever
        sends the request along the rescue route passes it to :meth:`take` first."""
        return self.chooser.rescue(route, lost_node, request)

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

    def give_back(self, probes: set[str]) -> None:
        """Probe leases a request took and will never deliver (its route changed, or
        it was answered before reaching the target)."""
        if probes and self.breakers is not None:
            self.breakers.abandon(probes)
            self.rebuild()

    def firsts(self, model_id: str) -> dict[str, str]:
        """Each pipeline of ``model_id`` in the plan, and its first node (where what the
        pipeline keeps of a prompt's prefix is known)."""
        return self._firsts.get(model_id, {})

    def first_nodes(self) -> set[str]:
        """The first nodes of every pipeline of a model whose nodes keep sessions."""
        return {
            n
            for m, firsts in self._firsts.items()
            if self.keeps_sessions(m)
            for n in firsts.values()
        }

    def keeps_sessions(self, model_id: str) -> bool:
        """Whether ``model_id``'s nodes keep per-session state (a generative executor's
        KV caches) that the router must release when a generation ends or moves."""
        return keeps_sessions(self.executor_kind(model_id))

    def executor_kind(self, model_id: str) -> ExecutorKind:
        """The kind the executor of ``model_id`` declares, as the plan carries it from its
        nodes' profiles, which says what its stage messages carry; a model no node of
        the plan runs yet is taken for a layer network."""
        return self._kinds.get(model_id, "layers")

    def layers(self, model_id: str) -> int:
        assert self.plan is not None
        m = self.plan.model(model_id)
        return m.layers if m is not None else 0
