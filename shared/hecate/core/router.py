"""A router's view: the latest snapshot plus the work it has dispatched itself.

The seed admits that cost-based spreading is reactive: with short requests and sudden
bursts, several requests pick the same copy before its telemetry reflects the load (exo
shipped exactly this bug, reading counts from stale state). A :class:`Router` counts
its own in-flight dispatches at decision time: :meth:`begin` raises the effective load of
every node on the route at once, :meth:`end` lowers it, so the next decision in the same
burst already sees the copy as busier.

It also counts what it measured itself: :meth:`measured` takes the time a step along a
pipeline took, and each pipeline's cost gains its link term (``w_l·link_P``, see
:mod:`hecate.core.cost` and :mod:`hecate.core.roundtrips`): its least recent step in
place of its nodes' reported latencies, or the unmeasured allowance on top of them.

The decision stays a lookup: pipeline costs come from the snapshot's cache, the
in-flight term is a per-pipeline counter kept up to date by ``begin``/``end``, the
link term one figure per pipeline, and each model's pipelines sit in a heap by their
cost now (:class:`hecate.core.cheapest.Cheapest`): a dispatch or a measurement
re-costs only the pipelines it touched, and a decision reads the top.

**The way back for the unmeasured** (:meth:`Router.explore`). The link term holds only
while this router sends a pipeline steps. One that gets none (passed over for a measured
pipeline within the allowance, or frozen long enough for its figure to be forgotten)
pays the allowance, and on cost alone would never be sent a step to measure it again:
a pipeline that had one bad moment would lose its traffic for good, however much
cheaper it is. An unmeasured pipeline is penalised, never ignored, so a small share of
requests goes where nothing is known: when the chosen pipeline is measured, at most one
decision in ``explore_every`` (20) and one every ``explore_s`` (1 s) per model, the
request goes instead to the cheapest unmeasured pipeline that is intact and not full and
that could be the choice once measured (costed as if its step took no time, the least
a measurement can say, it would beat the chosen one). Its step is timed like any other,
and from then on the cost model alone decides: a pipeline measured cheaper keeps the
traffic, one measured slower loses the next decision, and is tried again only once its
figure is forgotten. A new snapshot makes a look due at once (within those bounds),
since that is when a node comes back or a circuit closes.

Why a share of real requests, not the alternatives:

* **Not a prior** (holding a forgotten pipeline's last figure, aged, in place of the
  allowance): a figure from before a freeze, a partition or a restart says nothing of
  the pipeline now, and a figure only held is never renewed either: a pipeline whose
  last figure was bad would be passed over as surely as one charged the allowance.
* **Not a link probe that needs no request** (a ping to each node): it times a bus round
  trip, not a step (compute, the chain's hops, the node's queue), and needs every node
  to answer one more subject; a request measures exactly what the cost model uses.
* **Bounded, and only where it can matter.** At most 5 % of a model's decisions and one
  a second, and only to a pipeline every other rule already serves from: its nodes
  alive by telemetry, not suspected, circuits closed (or leased to this router), below
  its admission limit. A pipeline that could not win even measured at its best is never
  sent one. The price: a pipeline that stays slower gets a request each time its figure
  is forgotten (every two windows or so), as a production balancer pays for finding the
  one that recovered.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from hecate.core.cheapest import Cheapest
from hecate.core.cost import (
    DEFAULT_PENALTY,
    DEFAULT_WEIGHTS,
    ColdPenalty,
    RouteWeights,
    inflight_cost,
    link_cost,
    stage_latency_ms,
    token_cost,
)
from hecate.core.errors import Saturated
from hecate.core.plan import Pipeline, SwarmPlan
from hecate.core.roundtrips import DEFAULT_WINDOW_S, RoundTrips
from hecate.core.routing import DEFAULT_REQUEST, Route, RoutingRequest, no_route_error
from hecate.core.state import CostTable, SwarmState

# At most one exploration every DEFAULT_EXPLORE_S per model, and one decision in
# DEFAULT_EXPLORE_EVERY: a thawed pipeline is back within a second under load, and
# never more than 5 % of the traffic goes where nothing is known.
DEFAULT_EXPLORE_S = 1.0
DEFAULT_EXPLORE_EVERY = 20


@dataclass(slots=True)
class _Exploring:
    """One model's exploration, as :meth:`Router.explore` keeps it."""

    decisions: int = 0  # since its last exploration
    explored_at: float = -math.inf
    look_at: float = -math.inf  # when a look for an unmeasured pipeline is next due


class Router:
    """Routing decisions for one router process. Not thread-safe; one event loop owns it."""

    def __init__(
        self,
        state: SwarmState,
        weights: RouteWeights = DEFAULT_WEIGHTS,
        penalty: ColdPenalty = DEFAULT_PENALTY,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        explore_s: float = DEFAULT_EXPLORE_S,
        explore_every: int = DEFAULT_EXPLORE_EVERY,
    ) -> None:
        if not explore_s >= 0 or explore_every < 1:
            raise ValueError("need explore_s >= 0 and explore_every >= 1")
        self.weights = weights
        self.penalty = penalty
        self._per_request = inflight_cost(1, weights)
        self._node_in_flight: dict[str, int] = defaultdict(int)
        self._total_in_flight = 0
        self.round_trips = RoundTrips(window_s)
        self._now = float("-inf")  # the latest time this router was told
        self._compute_ms: dict[str, float] = {}  # Σ latency_n per pipeline, this snapshot
        # Each pipeline's link term as last computed, from when and until when it holds
        # (RoundTrips.lately): a decision reads it, a sample or a snapshot drops it.
        self._links: dict[str, tuple[float, float, float]] = {}
        # Per model, its cost table in this snapshot (the state caches it too, keyed by
        # the weights: hashing those at every decision cost more than the decision),
        # and its healthy pipelines by what each costs now (Cheapest); per pipeline of
        # those, its base cost and the pipeline.
        self._tables: dict[str, CostTable] = {}
        self._cheapest: dict[str, Cheapest] = {}
        self._base: dict[str, tuple[float, Pipeline]] = {}
        self.explore_s = explore_s
        self.explore_every = explore_every
        self._exploring: dict[str, _Exploring] = {}  # per model
        self.explored = 0  # requests sent to an unmeasured pipeline, in all
        self.state = state
        self._index_plan(None)

    def update(self, state: SwarmState) -> None:
        """Adopt a newer snapshot. Dispatches already counted stay counted, and so do
        the round trips measured on pipelines the plan keeps as they were."""
        before = self.state.plan
        self.state = state
        self._compute_ms = {}
        self._links = {}
        self._tables, self._cheapest, self._base = {}, {}, {}
        for e in self._exploring.values():  # a node may be back: look again
            e.look_at = e.explored_at + self.explore_s
        if state.plan is not before:
            self._index_plan(before)

    def _index_plan(self, before: SwarmPlan | None) -> None:
        self._plan_pipelines = {p.pipeline_id: p.stages for p in self.state.plan.pipelines}
        if before is not None:
            old = {p.pipeline_id: p.stages for p in before.pipelines}
            self.round_trips.keep(
                [pid for pid, stages in self._plan_pipelines.items() if old.get(pid) == stages]
            )
        self._model_of = {p.pipeline_id: p.model_id for p in self.state.plan.pipelines}
        self._cheapest = {}  # the in-flight counts below are counted afresh
        self._pipelines_of: dict[str, list[str]] = defaultdict(list)
        for p in self.state.plan.pipelines:
            for s in p.stages:
                self._pipelines_of[s.node_id].append(p.pipeline_id)
        self._pipeline_in_flight: dict[str, int] = defaultdict(int)
        for node_id, count in self._node_in_flight.items():
            for pid in self._pipelines_of.get(node_id, ()):
                self._pipeline_in_flight[pid] += count

    def in_flight(self, node_id: str | None = None) -> int:
        """Requests this router has outstanding on ``node_id`` (or in total)."""
        if node_id is None:
            return self._total_in_flight
        return self._node_in_flight.get(node_id, 0)

    def measured(self, pipeline_id: str, seconds: float, now: float) -> None:
        """A step along ``pipeline_id`` (one pass, or one decode step) took ``seconds``
        from its first send to its last reply, ending at ``now``. A route that is not a
        plan pipeline (a splice) is not measured: it cannot be chosen again."""
        self._now = max(self._now, now)
        if pipeline_id in self._plan_pipelines:
            self.round_trips.sample(pipeline_id, seconds * 1000, now)
            self._links.pop(pipeline_id, None)
            self._touch(pipeline_id)

    def forget(self, now: float) -> None:
        """Drop the round trips measured too long ago to count (they would not anyway)."""
        self._now = max(self._now, now)
        self.round_trips.forget(now)

    def link(self, pipeline: Pipeline, now: float | None = None) -> float:
        """The link term of ``pipeline``'s cost at ``now`` (by default the latest time
        this router was told)."""
        at = self._now if now is None else now
        pid = pipeline.pipeline_id
        kept = self._links.get(pid)
        if kept is not None and kept[1] <= at < kept[2]:
            return kept[0]
        least, until = self.round_trips.lately(pid, at)
        link = link_cost(least, self._compute(pipeline), self.weights, self.penalty)
        self._links[pid] = (link, at, until)
        return link

    def _compute(self, pipeline: Pipeline) -> float:
        """Σ ``latency_n`` of ``pipeline``'s nodes as costed, in this snapshot."""
        compute = self._compute_ms.get(pipeline.pipeline_id)
        if compute is None:
            compute = self._compute_ms[pipeline.pipeline_id] = sum(
                stage_latency_ms(
                    self.state.nodes[s.node_id], self.state.profile(s.node_id), self.penalty
                )
                for s in pipeline.stages
            )
        return compute

    def route(
        self,
        model_id: str,
        request: RoutingRequest = DEFAULT_REQUEST,
        full: Collection[str] = (),
        *,
        now: float | None = None,
    ) -> Route:
        """Like :func:`route_request`, with this router's in-flight work counted as load
        and its measured round trips as ``link_P``, as of ``now`` (by default the latest
        time this router was told).

        Pipelines named in ``full`` (at their admission limit) are passed over; when
        that leaves none of the healthy ones, :class:`Saturated` is raised: the request
        should wait, not be rescued."""
        cheapest = self._cheapest.get(model_id)
        if cheapest is None:
            table = self._table(model_id)
            if not table:
                raise no_route_error(model_id, self.state)
            self._base.update((pid, (base, p)) for base, pid, p in table)
            cheapest = self._cheapest[model_id] = Cheapest(
                (pid for _base, pid, _p in table), self._cost_now
            )
        at = self._now if now is None else now
        picked = cheapest.pick(at, full)
        if picked is None:
            raise Saturated(f"every healthy pipeline of {model_id!r} is at its admission limit")
        best_cost, best_id = picked
        if request.cached:
            best_cost, best_id = self._with_cache(model_id, request, (best_cost, best_id), full, at)
        return Route(
            model_id=model_id,
            pipeline_id=best_id,
            cost=best_cost + token_cost(request.tokens, self.weights),
            stages=self._base[best_id][1].stages,
        )

    def _with_cache(
        self,
        model_id: str,
        request: RoutingRequest,
        picked: tuple[float, str],
        full: Collection[str],
        at: float,
    ) -> tuple[float, str]:
        """The cheapest of ``picked`` (the heap's, costed without caches) and the
        healthy pipelines with room that keep some of the prompt cached, each less what
        that saves (:meth:`_saving`; O(those), beside the heap's pick)."""
        cost, pid = picked
        best = (cost - self._saving(pid, request), pid)
        for other in request.cached:
            if other == pid or other in full or self._model_of.get(other) != model_id:
                continue
            if other not in self._base:
                continue  # not healthy in this snapshot
            best = min(best, (self._cost_now(other, at)[0] - self._saving(other, request), other))
        return best

    def _saving(self, pipeline_id: str, request: RoutingRequest) -> float:
        """What ``request``'s cached prefix saves on ``pipeline_id``: the prefill it spares
        (``RoutingRequest.saves``), whole on a pipeline this router has nothing on, and
        less the more it has there (over the square of one more than its work on the
        pipeline's nodes): a prefill waits behind theirs, and a burst of prompts sharing
        a prefix spreads, the pipeline keeping it taking the first; else the token term."""
        saves = request.saves.get(pipeline_id)
        if saves is None:
            return token_cost(request.cached.get(pipeline_id, 0), self.weights)
        return saves / (1 + self._pipeline_in_flight.get(pipeline_id, 0)) ** 2

    def _table(self, model_id: str) -> CostTable:
        """``model_id``'s cost table in this snapshot."""
        table = self._tables.get(model_id)
        if table is None:
            table = self._tables[model_id] = self.state.cost_table(
                model_id, self.weights, self.penalty
            )
        return table

    def _cost_now(self, pipeline_id: str, at: float) -> tuple[float, float]:
        """What ``pipeline_id`` costs at ``at`` (its base, this router's in-flight work
        on it, its link term), and until when that holds with no dispatch on it and no
        step of it measured meanwhile."""
        base, p = self._base[pipeline_id]
        link = self.link(p, at)
        busy = self._pipeline_in_flight.get(pipeline_id, 0)
        return base + self._per_request * busy + link, self._links[pipeline_id][2]

    def _touch(self, pipeline_id: str) -> None:
        """``pipeline_id``'s cost changed: its model's heap hears of it."""
        cheapest = self._cheapest.get(self._model_of.get(pipeline_id, ""))
        if cheapest is not None:
            cheapest.touch(pipeline_id)

    def explore(
        self,
        model_id: str,
        chosen: Route,
        request: RoutingRequest = DEFAULT_REQUEST,
        full: Collection[str] = (),
        *,
        now: float | None = None,
    ) -> Route | None:
        """The route to send this request along instead of ``chosen`` (what
        :meth:`route` gave for it, with the same ``full`` and ``now``) so that an
        unmeasured pipeline is measured, or None: not due, or none worth it (see the
        module doc). Call once per decision: the decisions are counted here."""
        e = self._exploring.get(model_id)
        if e is None:
            e = self._exploring[model_id] = _Exploring()
        e.decisions += 1
        at = self._now if now is None else now
        if e.decisions < self.explore_every or at < e.look_at:
            return None
        trips = self.round_trips
        if trips.least_ms(chosen.pipeline_id, at) is None:
            return None  # this very request measures the chosen one: it explores already
        e.look_at = at + self.explore_s
        busy = self._pipeline_in_flight
        best_cost = math.inf
        unmeasured: list[tuple[float, str, float, Pipeline]] = []
        for base, pid, p in self._table(model_id):
            if pid in full:
                continue
            known = base + self._per_request * busy.get(pid, 0)  # all but the link term
            if pid == chosen.pipeline_id:
                best_cost = known + self.link(p, at)
            elif trips.least_ms(pid, at) is None:
                unmeasured.append((known + self.link(p, at), pid, known, p))
        unmeasured.sort(key=lambda row: (row[0], row[1]))  # the cheapest as costed first
        for cost, pid, known, p in unmeasured:
            # Its cost if its step took no time, the least a measurement could say:
            # one that would lose even then is not worth a request.
            best_case = known + link_cost(0.0, self._compute(p), self.weights, self.penalty)
            if (best_case, pid) < (best_cost, chosen.pipeline_id):
                e.decisions, e.explored_at = 0, at
                self.explored += 1
                return Route(
                    model_id=model_id,
                    pipeline_id=pid,
                    cost=cost + token_cost(request.tokens, self.weights),
                    stages=p.stages,
                )
        return None

    def begin(self, route: Route) -> None:
        """Count a dispatch along ``route`` (call once per request sent)."""
        self._add(route, 1)

    def end(self, route: Route) -> None:
        """Count the end of a dispatch begun with :meth:`begin` (answer, error or timeout)."""
        self._add(route, -1)

    def _add(self, route: Route, delta: int) -> None:
        for s in route.stages:
            before = self._node_in_flight[s.node_id]
            after = max(0, before + delta)
            if after == before:
                continue
            self._node_in_flight[s.node_id] = after
            for pid in self._pipelines_of.get(s.node_id, ()):
                self._pipeline_in_flight[pid] += after - before
                self._touch(pid)
        self._total_in_flight = max(0, self._total_in_flight + delta)
