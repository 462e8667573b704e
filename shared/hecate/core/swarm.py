"""The swarm lifecycle: plan, route, lose nodes, get them back, grow, shrink.

:class:`Swarm` is the whole policy, pure and synchronous: no clock, no I/O. A service
shell feeds it events and carries out what it returns.

Routing and rescue are delegated to a :class:`RoutePolicy` when one is given: the
router's own chooser (``hecate.routing.Chooser``, a layer above the core, hence passed
in), which is how ``hecate swarm-sim`` runs the production policy. Without one, a swarm
routes to the cheapest intact pipeline and keeps the splice its last failover found.

Order of operations on a death: :meth:`Swarm.mark_down` computes the route *before*
marking the node dead. Marked first, the pipeline that used it would no longer be
eligible and there would be nothing to repair: failover must know what was lost.

Status: ``failed`` requires **zero live nodes**, not zero pipelines. A swarm whose only
pipeline lost a node but still has survivors is ``degraded`` and keeps serving; killing
the service because the ideal topology is gone would be the worst outcome.

Growth policy (a node joins; existing pipelines are never reshuffled, to avoid churn):

1. **replica** — the base model has fewer intact pipelines than configured: build the
   missing copies from spare capacity (the newcomer's and what live nodes have left).
2. **expert** — otherwise, a reserve or expert model has fewer pipelines than it asks
   for: host it on spare capacity (the "telomerase" that grows experts).
3. **capacity** — otherwise the newcomer joins as spare capacity, used by later
   relocations and growth.

Removal (a node retires): every pipeline that used it is repaired in place by moving the
retiring node's layer ranges to spare capacity on live nodes; a pipeline that cannot be
repaired is dropped, and missing copies are rebuilt from spare capacity where possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, Protocol

import msgspec
from msgspec.structs import replace

from hecate.core.errors import (
    DuplicateNode,
    InsufficientCapacity,
    RoutingError,
    SwarmStopped,
    Unrecoverable,
)
from hecate.core.failover import FailoverOptions, Recovered, Replacement, failover_in_swarm
from hecate.core.plan import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan, executes
from hecate.core.planners import ROLE_ORDER, Planner, get_planner
from hecate.core.routing import DEFAULT_REQUEST, Route, RoutingRequest, route_request
from hecate.core.state import SwarmState
from hecate.core.telemetry import NodeState

SwarmStatus = Literal["healthy", "degraded", "failed", "stopped"]
GrowthKind = Literal["replica", "expert", "capacity"]


class SwarmConfig(msgspec.Struct, frozen=True):
    """``layers`` and ``pipelines`` (replicas) of the base model, plus any other models.

    ``SwarmConfig(12, 2)``: the first two may be given positionally, as in the seed.
    """

    layers: int
    pipelines: int = 2
    model_id: str = "base"
    models: tuple[ModelSpec, ...] = ()
    failover: FailoverOptions = FailoverOptions()
    executor: str = "toy"  # what computes the base model

    def all_models(self) -> tuple[ModelSpec, ...]:
        base = ModelSpec(
            model_id=self.model_id,
            layers=self.layers,
            role="base",
            replicas=self.pipelines,
            executor=self.executor,
        )
        return (base, *self.models)


class RoutePolicy(Protocol):
    """What chooses routes and rescues: fed the swarm's plan and node states, asked for
    the route of a new request (and whether it is degraded) and for the rescue of a
    route that lost a node."""

    def observe(self, plan: SwarmPlan, nodes: Mapping[str, NodeState], *, now: float) -> None: ...

    def choose(self, model_id: str, request: RoutingRequest) -> tuple[Route, bool]: ...

    def rescue(
        self, route: Route, lost_node: str, request: RoutingRequest
    ) -> Recovered | Unrecoverable: ...


class Growth(msgspec.Struct, frozen=True, kw_only=True):
    """What a newcomer changed: which policy applied and which pipelines it made."""

    node_id: str
    kind: GrowthKind
    pipelines: tuple[str, ...]
    epoch: int


class Removal(msgspec.Struct, frozen=True, kw_only=True):
    """What retiring a node changed."""

    node_id: str
    relocated: tuple[Replacement, ...]
    dropped: tuple[str, ...]
    rebuilt: tuple[str, ...]
    epoch: int


class Swarm:
    """Plan + telemetry + policy for one swarm."""

    def __init__(
        self,
        profiles: Iterable[NodeProfile],
        config: SwarmConfig,
        *,
        planner: Planner | str = "greedy",
        policy: RoutePolicy | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self._observed: SwarmState | None = None
        self.planner = get_planner(planner) if isinstance(planner, str) else planner
        plan = self.planner.plan(config.all_models(), profiles)
        if not plan.pipelines_of(config.model_id):
            base = config.all_models()[0]
            eligible = [n for n in plan.nodes if executes(n.executor, base)]
            total = sum(n.capacity_layers for n in eligible)
            raise InsufficientCapacity(
                f"{len(eligible)} nodes running executor {base.executor!r} with {total} "
                f"layers of capacity cannot hold one pipeline of {config.model_id!r} "
                f"({config.layers} layers)"
            )
        self.state = SwarmState.from_profiles(plan)
        self._rescues: dict[str, Route] = {}
        self._stopped = False

    @classmethod
    def resume(
        cls,
        plan: SwarmPlan,
        config: SwarmConfig,
        *,
        planner: Planner | str = "greedy",
        policy: RoutePolicy | None = None,
    ) -> Swarm:
        """Carry on from a published plan (another planner's) instead of planning afresh:
        growth and retirement then change it without reshuffling what already serves."""
        swarm = cls.__new__(cls)
        swarm.config = config
        swarm.policy = policy
        swarm._observed = None
        swarm.planner = get_planner(planner) if isinstance(planner, str) else planner
        swarm.state = SwarmState.from_profiles(plan)
        swarm._rescues = {}
        swarm._stopped = False
        return swarm

    @property
    def plan(self) -> SwarmPlan:
        return self.state.plan

    # -- routing ---------------------------------------------------------------------

    def route(
        self, request: RoutingRequest = DEFAULT_REQUEST, model_id: str | None = None
    ) -> Route:
        """The cheapest intact pipeline, else the splice a failover put in service (with
        a policy: the policy's choice, which may be a reserve model's route)."""
        return self.choose(request, model_id)[0]

    def choose(
        self, request: RoutingRequest = DEFAULT_REQUEST, model_id: str | None = None
    ) -> tuple[Route, bool]:
        """The route of a new request for ``model_id`` (base by default) and whether it is
        degraded (only a policy routes a new request to the reserve model)."""
        if self._stopped:
            raise SwarmStopped("the swarm is stopped; start it before routing")
        model_id = model_id or self.config.model_id
        if self.policy is not None:
            return self._policy().choose(model_id, request)
        return self._route(request, model_id), False

    def _policy(self) -> RoutePolicy:
        assert self.policy is not None
        if self._observed is not self.state:  # the state is immutable: observe each once
            # No clock: the swarm raises no suspicions that could lapse.
            self.policy.observe(self.plan, self.state.nodes, now=0.0)
            self._observed = self.state
        return self.policy

    def _route(self, request: RoutingRequest, model_id: str) -> Route:
        try:
            return route_request(model_id, request, self.state)
        except RoutingError:
            rescue = self._rescues.get(model_id)
            if rescue is not None and all(self.state.is_alive(n) for n in rescue.node_ids):
                return rescue
            raise

    def mark_down(
        self,
        node_id: str,
        request: RoutingRequest = DEFAULT_REQUEST,
        model_id: str | None = None,
    ) -> Recovered | Unrecoverable:
        """Record a death and return the rescue route for ``model_id`` (base by default)."""
        model_id = model_id or self.config.model_id
        self.state.node(node_id)  # UnknownNode for a stranger
        try:
            before: Route | None
            before, was_degraded = self.choose(request, model_id)
        except RoutingError:
            before, was_degraded = None, False
        self.state = self.state.mark(node_id, alive=False)
        if before is None:
            return Unrecoverable(
                f"{model_id!r} had no route in service when {node_id!r} was lost",
                model_id=model_id,
                lost_node=node_id,
            )
        if self.policy is not None:
            # The policy finds a splice again for each new request; nothing to keep.
            result = self._policy().rescue(before, node_id, request)
            if was_degraded and isinstance(result, Recovered) and result.kind == "unaffected":
                return replace(result, degraded=True)  # still the reserve model's answer
            return result
        result = failover_in_swarm(
            before, node_id, self.state, self.config.failover, request=request
        )
        if isinstance(result, Recovered) and result.kind == "splice":
            self._rescues[model_id] = result.route
        return result

    def mark_alive(self, node_id: str) -> None:
        self.state = self.state.mark(node_id, alive=True)

    # -- status ----------------------------------------------------------------------

    def status(self) -> SwarmStatus:
        """``failed`` iff no node is alive; ``degraded`` while any model has fewer intact
        pipelines than it should (the base: its configured replicas; another model: as
        many as it had planned, up to its target); ``healthy`` otherwise."""
        if self._stopped:
            return "stopped"
        if not self.state.live_nodes():
            return "failed"
        for m in self.plan.models:
            planned = self.plan.pipelines_of(m.model_id)
            intact = sum(1 for p in planned if self.state.pipeline_alive(p))
            expected = m.replicas if m.role == "base" else min(m.replicas, len(planned))
            if intact < expected:
                return "degraded"
        return "healthy"

    def stop(self) -> None:
        self._stopped = True

    def start(self) -> None:
        self._stopped = False

    # -- growth and retirement -------------------------------------------------------

    def add_node(self, profile: NodeProfile) -> Growth:
        """A node joins without a restart; see the growth policy in the module doc."""
        if profile.node_id in self.state.nodes:
            raise DuplicateNode(f"node {profile.node_id!r} is already a member")
        plan = self.plan
        grown = replace(plan, nodes=(*plan.nodes, profile))
        state = self.state.with_plan(grown).with_node(
            profile.node_id, NodeState(latency_ms=profile.latency_ms, score=profile.score)
        )
        kind: GrowthKind = "capacity"
        new: list[Pipeline] = []
        for m in sorted(plan.models, key=lambda m: (ROLE_ORDER[m.role], m.model_id)):
            new = self._build_missing(m, state, grown)
            if new:
                kind = "replica" if m.role == "base" else "expert"
                break
            if (
                m.role == "base"
                and executes(profile.executor, m)
                and self._missing(m, state, grown) > 0
            ):
                # The base is short of copies and this node cannot complete one yet:
                # keep it as spare for the base rather than spend it on another model
                # (unless it cannot run the base at all).
                break
        self._adopt(state, pipelines=(*plan.pipelines, *new))
        return Growth(
            node_id=profile.node_id,
            kind=kind,
            pipelines=tuple(p.pipeline_id for p in new),
            epoch=self.plan.epoch,
        )

    def remove_node(self, node_id: str) -> Removal:
        """Retire a node: relocate its layers to spare capacity, rebuild what cannot be."""
        self.state.node(node_id)
        before = self.plan
        without = replace(
            before, nodes=tuple(n for n in before.nodes if n.node_id != node_id)
        )  # every old pipeline still counted, so spare capacity is not double-booked
        state = self.state.with_plan(without)
        free = _spare(state, without)
        pipelines: list[Pipeline] = []
        relocated: list[Replacement] = []
        dropped: list[str] = []
        for p in before.pipelines:
            if node_id not in p.node_ids:
                pipelines.append(p)
                continue
            repaired = _relocate(p, node_id, free, state)
            if repaired is not None:
                pipelines.append(repaired[0])
                relocated += repaired[1]
                continue
            dropped.append(p.pipeline_id)
            for s in p.stages:  # a dropped pipeline gives its layers back
                if s.node_id != node_id and state.is_alive(s.node_id):
                    free[s.node_id] = free.get(s.node_id, 0) + s.size
        rebuilt: list[Pipeline] = []
        for m in sorted(before.models, key=lambda m: (ROLE_ORDER[m.role], m.model_id)):
            rebuilt += self._build_missing(
                m, state, replace(without, pipelines=(*pipelines, *rebuilt))
            )
        self._adopt(state, pipelines=(*pipelines, *rebuilt))
        return Removal(
            node_id=node_id,
            relocated=tuple(relocated),
            dropped=tuple(dropped),
            rebuilt=tuple(p.pipeline_id for p in rebuilt),
            epoch=self.plan.epoch,
        )

    @staticmethod
    def _missing(model: ModelSpec, state: SwarmState, plan: SwarmPlan) -> int:
        intact = sum(1 for p in plan.pipelines_of(model.model_id) if state.pipeline_alive(p))
        return model.replicas - intact

    def _build_missing(
        self, model: ModelSpec, state: SwarmState, plan: SwarmPlan
    ) -> list[Pipeline]:
        """New pipelines of ``model`` from spare live capacity, up to its replica target."""
        missing = self._missing(model, state, plan)
        if missing <= 0:
            return []
        mine = plan.pipelines_of(model.model_id)
        intact = [p for p in mine if state.pipeline_alive(p)]
        profiles = {n.node_id: n for n in plan.nodes}
        taken = {p.pipeline_id for p in mine}
        first = 0
        while f"{model.model_id}-r{first}" in taken:
            first += 1
        avoid = frozenset(n for p in intact for n in p.node_ids)
        new = self.planner.copies(
            model, missing, _spare(state, plan), profiles, first_index=first, avoid=avoid
        )
        # Pipeline ids must stay unique even when the planner numbers past a gap.
        out: list[Pipeline] = []
        for p in new:
            pid, n = p.pipeline_id, first
            while pid in taken:
                n += 1
                pid = f"{model.model_id}-r{n}"
            taken.add(pid)
            out.append(Pipeline(pipeline_id=pid, model_id=p.model_id, stages=p.stages))
        return out

    def _adopt(self, state: SwarmState, *, pipelines: tuple[Pipeline, ...]) -> None:
        plan = replace(state.plan, epoch=self.plan.epoch + 1, pipelines=pipelines)
        self.state = state.with_plan(plan)
        # A splice stays in service only while the plan still backs every one of its
        # stages: a retired or re-planned node must not keep receiving those layers.
        self._rescues = {m: r for m, r in self._rescues.items() if _backed(plan, r)}


def _backed(plan: SwarmPlan, route: Route) -> bool:
    """Every stage of ``route`` lies within a range its node holds for that model."""
    held = [s for p in plan.pipelines_of(route.model_id) for s in p.stages]
    return all(
        any(
            h.node_id == s.node_id and h.layer_start <= s.layer_start and s.layer_end <= h.layer_end
            for h in held
        )
        for s in route.stages
    )


def _spare(state: SwarmState, plan: SwarmPlan) -> dict[str, int]:
    """Layer capacity each *live* node has left under ``plan``."""
    used = plan.layers_used()
    return {
        n.node_id: n.capacity_layers - used.get(n.node_id, 0)
        for n in plan.nodes
        if state.is_alive(n.node_id) and n.capacity_layers > used.get(n.node_id, 0)
    }


def _relocate(
    p: Pipeline, node_id: str, free: dict[str, int], state: SwarmState
) -> tuple[Pipeline, list[Replacement]] | None:
    """``p`` with ``node_id``'s ranges moved to spare capacity, or None if it does not fit.

    Consumes ``free`` only on success.
    """
    model = state.plan.model(p.model_id)
    profile = {n.node_id: n for n in state.plan.nodes}
    # Only nodes that run the model's executor may take over its layers.
    left = {i: f for i, f in free.items() if model is None or executes(profile[i].executor, model)}
    stages: list[Stage] = []
    moved: list[Replacement] = []
    for s in p.stages:
        if s.node_id != node_id:
            stages.append(s)
            continue
        at = s.layer_start
        while at < s.layer_end:
            candidates = [i for i, f in left.items() if f > 0]
            if not candidates:
                return None
            best = min(candidates, key=lambda i: (-left[i], profile[i].latency_ms, i))
            end = min(s.layer_end, at + left[best])
            left[best] -= end - at
            stages.append(Stage(node_id=best, layer_start=at, layer_end=end))
            moved.append(
                Replacement(layer_start=at, layer_end=end, old_node=node_id, new_node=best)
            )
            at = end
    free.update(left)
    return Pipeline(pipeline_id=p.pipeline_id, model_id=p.model_id, stages=tuple(stages)), moved
