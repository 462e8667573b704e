"""The router's policy, pure: which nodes may take work, which route a request takes,
how a request in flight is rescued.

A :class:`Chooser` is fed what a router knows (the plan, each node's state as telemetry
reports it, the circuits that are open and the probe leases this router holds) and its
own short-lived suspicions of nodes it just saw fail, with the time passed in. It folds
them into a core :class:`SwarmState` and :class:`Router`, and decides:

1. **Usable nodes.** A node takes work when telemetry calls it alive, this router does
   not suspect it, and its circuit is closed or this router holds its probe lease. A
   suspicion lapses after ``suspect_s``, or as soon as telemetry has heard from the node
   since it was suspected.
2. **A new request** goes to the cheapest intact pipeline (this router's in-flight work
   counted as load, and the round trips it measured on each pipeline as its link term,
   see :mod:`hecate.core.roundtrips`; a rescue is costed from the snapshot), except for
   the bounded share that goes to an unmeasured intact pipeline so that it is measured
   again (:meth:`Router.explore <hecate.core.router.Router.explore>`), and the request
   that carries a probe: while this router holds a target's probe lease, its next
   request that an intact pipeline through the target can take goes there (the
   cheapest such), since the circuit stays open until the probe reports and a lease
   spent on nothing would keep it open however long the traffic lasts. Pipelines in
   ``full`` are at their admission limit: when only those are intact,
   :class:`Saturated` is raised, since load is a reason to wait, never to splice or
   degrade.
3. **No intact pipeline**: the best rescue of a broken one, in the failover tiers' order
   (a per-layer splice, else the reserve model when allowed; a splice beats a degraded
   answer, then the cheaper, then the pipeline id). When none is found and only this
   router's suspicion stands in the way, the same decision on what telemetry and the
   circuits say (an intact pipeline, else the best rescue): suspicion steers traffic
   away from a node, it never refuses a model telemetry calls servable, whole or spliced.
5. **Only open circuits in the way**: when the circuits block every route of a model
   that telemetry calls alive, the same decision on what telemetry alone says. Circuits
   that open on every copy at once measure the whole swarm's overload (stage timeouts
   while every node queues), not a sick node: refusing everything for a cooldown would
   turn load into an outage. As Envoy's outlier detection never ejects past its
   ``max_ejection_percent`` and routes to every host past its panic threshold, a circuit
   steers traffic away from a node while another way exists, and never refuses the last
   one. A node that is really sick answers errors there, which are answered as errors.
4. **A request in flight** whose node failed is rescued by the failover tiers (replica,
   splice, reserve, unrecoverable) on the folded state: the lost node and every node
   unusable now are avoided.

The router service (``SwarmView``, through ``hecate_router``) and the in-memory swarm
(:class:`~hecate.core.swarm.Swarm`, run by ``hecate swarm-sim`` and the planner) both
decide through this class, so the simulation runs the production policy. It lives in the
core, which it is made of, so that ``Swarm`` can have no other policy.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import msgspec

from hecate.core.cost import (
    DEFAULT_PENALTY,
    DEFAULT_WEIGHTS,
    ColdPenalty,
    RouteWeights,
    token_cost,
)
from hecate.core.errors import NoHealthyPipeline, Unrecoverable
from hecate.core.failover import FailoverOptions, Recovered, failover_in_swarm
from hecate.core.plan import SwarmPlan
from hecate.core.roundtrips import DEFAULT_WINDOW_S
from hecate.core.router import DEFAULT_EXPLORE_EVERY, DEFAULT_EXPLORE_S, Router
from hecate.core.routing import DEFAULT_REQUEST, Route, RoutingRequest, route_request
from hecate.core.state import SwarmState
from hecate.core.telemetry import NodeState


class Chooser:
    """Routing and rescue decisions for one router. Not thread-safe; no clock of its own."""

    def __init__(
        self,
        failover: FailoverOptions = FailoverOptions(),  # noqa: B008 (frozen, immutable)
        *,
        suspect_s: float = 5.0,
        weights: RouteWeights = DEFAULT_WEIGHTS,
        penalty: ColdPenalty = DEFAULT_PENALTY,
        window_s: float = DEFAULT_WINDOW_S,
        explore_s: float = DEFAULT_EXPLORE_S,
        explore_every: int = DEFAULT_EXPLORE_EVERY,
    ) -> None:
        self.failover = failover
        self.suspect_s = suspect_s
        self.window_s = window_s
        self.explore_s = explore_s
        self.explore_every = explore_every
        self.weights = weights
        self.penalty = penalty
        self.suspects: dict[str, float] = {}  # node -> when this router saw it fail
        self.router: Router | None = None
        # What telemetry and the circuits alone say, when a suspicion is in force; and
        # what telemetry alone says, when a circuit is open (the last resort, rule 5).
        self.unsuspected: SwarmState | None = None
        self.panic: SwarmState | None = None
        self.leased: frozenset[str] = frozenset()  # open circuits whose probe we may send
        self._inputs: tuple[SwarmPlan, Mapping[str, NodeState], frozenset[str], Mapping[str, float]]
        # The best rescue of each model, per snapshot (the folded and the unsuspected).
        self._rescues: list[tuple[SwarmState, dict[str, Recovered | None]]] = []

    # -- what the router knows -------------------------------------------------------

    def observe(
        self,
        plan: SwarmPlan,
        nodes: Mapping[str, NodeState],
        *,
        now: float,
        open_circuits: Collection[str] = (),
        leased: Collection[str] = (),
        heard: Mapping[str, float] | None = None,
    ) -> None:
        """Adopt the latest plan, node states (a node telemetry has not reported on is
        taken as alive and cold) and circuits: ``open_circuits`` are the targets whose
        circuit is not closed, ``leased`` those whose probe lease this router holds.
        ``heard`` is when telemetry last heard from each node it calls alive (by default
        the ``last_seen`` of each alive node): a suspicion older than that is cleared."""
        blocked = frozenset(open_circuits) - frozenset(leased)
        self.leased = frozenset(leased) & frozenset(open_circuits)
        if heard is None:
            heard = {i: n.last_seen or 0.0 for i, n in nodes.items() if n.alive}
        self._inputs = (plan, nodes, blocked, heard)
        self._fold(now)

    def suspect(self, node_id: str, now: float) -> None:
        """Steer new requests away from a node that just failed a stage."""
        self.suspects[node_id] = now
        if self.router is not None:
            self._fold(now)

    def measured(self, pipeline_id: str, seconds: float, now: float) -> None:
        """A step along ``pipeline_id`` took ``seconds`` (see :meth:`Router.measured`)."""
        if self.router is not None:
            self.router.measured(pipeline_id, seconds, now)

    def lapsed(self, now: float) -> bool:
        """Whether some suspicion has run out (fold again, even with nothing new)."""
        return bool(self.suspects) and now - min(self.suspects.values()) > self.suspect_s

    def expire(self, now: float) -> None:
        """Suspicions lapse even when nothing new arrives to clear them."""
        if self.lapsed(now) and self.router is not None:
            self._fold(now)

    @property
    def state(self) -> SwarmState:
        """The folded snapshot every decision reads."""
        assert self.router is not None, "observe() a plan first"
        return self.router.state

    def usable(self, node_id: str) -> bool:
        return self.state.is_alive(node_id)

    def _fold(self, now: float) -> None:
        plan, seen, blocked, heard = self._inputs
        for node_id, at in list(self.suspects.items()):
            if heard.get(node_id, -1.0) > at or now - at > self.suspect_s:
                del self.suspects[node_id]
        nodes: dict[str, NodeState] = {}
        plain: dict[str, NodeState] = {}
        for profile in plan.nodes:
            node_id = profile.node_id
            state = seen.get(node_id) or NodeState()
            if node_id in blocked and state.alive:
                state = _down(state)
            plain[node_id] = state
            nodes[node_id] = _down(state) if node_id in self.suspects and state.alive else state
        snapshot = SwarmState(plan, nodes)
        self.unsuspected = SwarmState(plan, plain) if self.suspects else None
        alone = {p.node_id: seen.get(p.node_id) or NodeState() for p in plan.nodes}
        self.panic = SwarmState(plan, alone) if blocked else None
        if self.router is None:
            self.router = Router(
                snapshot,
                self.weights,
                self.penalty,
                window_s=self.window_s,
                explore_s=self.explore_s,
                explore_every=self.explore_every,
            )
        else:
            self.router.update(snapshot)
        self.router.forget(now)

    # -- decisions -------------------------------------------------------------------

    def choose(
        self,
        model_id: str,
        request: RoutingRequest = DEFAULT_REQUEST,
        full: Collection[str] = (),
        *,
        now: float | None = None,
    ) -> tuple[Route, bool]:
        """The route for a new request and whether it is degraded (see the module doc,
        rules 2 and 3), with round trips as measured at ``now`` (by default the latest
        time the chooser was told). Raises :class:`Saturated` when every intact
        pipeline is in ``full``, :class:`NoSuchModel` or :class:`NoHealthyPipeline` when
        there is no route at all."""
        assert self.router is not None, "observe() a plan first"
        try:
            route = self.router.route(model_id, request, full, now=now)
        except NoHealthyPipeline as exc:
            rescue = self._best_rescue(self.state, model_id, request)
            if rescue is not None:
                return rescue.route, rescue.degraded
            refused = exc
        else:
            probe = self._probe(model_id, route, request, full)
            if probe is not None:
                return probe, False
            trial = self.router.explore(model_id, route, request, full, now=now)
            return (route if trial is None else trial), False
        # Only suspicion stands in the way: decide as if there were none; only open
        # circuits: as if they were closed.
        for fallback in (self.unsuspected, self.panic):
            if fallback is None:
                continue
            try:
                return route_request(model_id, request, fallback, self.weights, self.penalty), False
            except NoHealthyPipeline:
                rescue = self._best_rescue(fallback, model_id, request)
                if rescue is not None:
                    return rescue.route, rescue.degraded
        raise refused

    def _probe(
        self, model_id: str, chosen: Route, request: RoutingRequest, full: Collection[str]
    ) -> Route | None:
        """The cheapest intact pipeline with room through a target whose probe lease
        this router holds, when ``chosen`` passes by every such target (rule 2)."""
        if not self.leased or self.leased.intersection(chosen.node_ids):
            return None
        for cost, pid, p in self.state.cost_table(model_id, self.weights, self.penalty):
            if pid not in full and any(s.node_id in self.leased for s in p.stages):
                return Route(
                    model_id=model_id,
                    pipeline_id=pid,
                    cost=cost + token_cost(request.tokens, self.weights),
                    stages=p.stages,
                )
        return None

    def saturated(self, model_id: str, full: Collection[str]) -> bool:
        """Every intact pipeline of ``model_id`` is in ``full`` (and there is one): a
        request for it now would wait for room."""
        table = self.state.cost_table(model_id, self.weights, self.penalty)
        return bool(table) and all(pid in full for _cost, pid, _p in table)

    def rescue(
        self, route: Route, lost_node: str, request: RoutingRequest = DEFAULT_REQUEST
    ) -> Recovered | Unrecoverable:
        """The failover of a request in flight on ``route`` after ``lost_node`` failed it
        (through open circuits only when nothing else is left, as rule 5 says)."""
        result = self._rescue(self.state, route, lost_node, request)
        if isinstance(result, Unrecoverable) and self.panic is not None:
            alone = self._rescue(self.panic, route, lost_node, request)
            return alone if isinstance(alone, Recovered) else result
        return result

    def _rescue(
        self, state: SwarmState, route: Route, lost_node: str, request: RoutingRequest
    ) -> Recovered | Unrecoverable:
        return failover_in_swarm(
            route,
            lost_node,
            state,
            self.failover,
            request=request,
            weights=self.weights,
            penalty=self.penalty,
        )

    def _best_rescue(
        self, state: SwarmState, model_id: str, request: RoutingRequest
    ) -> Recovered | None:
        """Computed once per snapshot and model, not per request (a snapshot is
        immutable, so the folded one and the unsuspected one each have their own)."""
        cache = next((c for s, c in self._rescues if s is state), None)
        if cache is None:
            current = (self.state, self.unsuspected, self.panic)
            cache = {}
            self._rescues = [
                *((s, c) for s, c in self._rescues if any(s is k for k in current)),
                (state, cache),
            ]
        if model_id not in cache:
            found: list[Recovered] = []
            for p in state.plan.pipelines_of(model_id):
                dead = next((s.node_id for s in p.stages if not state.is_alive(s.node_id)), None)
                if dead is None:
                    continue
                broken = Route(
                    model_id=model_id, pipeline_id=p.pipeline_id, cost=0.0, stages=p.stages
                )
                result = self._rescue(state, broken, dead, request)
                if isinstance(result, Recovered):
                    found.append(result)
            cache[model_id] = min(
                found, key=lambda r: (r.degraded, r.route.cost, r.route.pipeline_id), default=None
            )
        return cache[model_id]


def _down(state: NodeState) -> NodeState:
    return msgspec.structs.replace(state, alive=False)
