"""The swarm lifecycle: plan, route, lose nodes, get them back, grow, shrink.

:class:`Swarm` is the whole policy, pure and synchronous: no clock, no I/O. A service
shell feeds it events and carries out what it returns.

Routing and rescue are the router's own :class:`~hecate.core.chooser.Chooser`: a new
request goes to the cheapest intact pipeline, else the best rescue of a broken one (a
splice, else the reserve model when degradation is allowed), and a request on a route
that loses a node is rescued through the failover tiers. That is how ``hecate swarm-sim``
shows what a running router does.

Order of operations on a death: :meth:`Swarm.mark_down` computes the route *before*
marking the node dead. Marked first, the pipeline that used it would no longer be
eligible and there would be nothing to repair: failover must know what was lost.

Status: ``failed`` requires **zero live nodes**, not zero pipelines. A swarm whose only
pipeline lost a node but still has survivors is ``degraded`` and keeps serving; killing
the service because the ideal topology is gone would be the worst outcome.

Growth and retirement change the plan without reshuffling what already serves; their
policy is in :mod:`hecate.core.growth`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec
from msgspec.structs import replace

from hecate.core.chooser import Chooser
from hecate.core.errors import (
    DuplicateNode,
    InsufficientCapacity,
    RoutingError,
    SwarmStopped,
    Unrecoverable,
)
from hecate.core.failover import FailoverOptions, Recovered
from hecate.core.growth import Growth, GrowthKind, Removal, grow, retire
from hecate.core.plan import ModelSpec, NodeProfile, Pipeline, SwarmPlan, executes
from hecate.core.planners import Planner, get_planner
from hecate.core.routing import DEFAULT_REQUEST, Route, RoutingRequest
from hecate.core.state import SwarmState

SwarmStatus = Literal["healthy", "degraded", "failed", "stopped"]

__all__ = ["Growth", "GrowthKind", "Removal", "Swarm", "SwarmConfig", "SwarmStatus"]


#: The least copies of the base an ``auto`` plan aims for before the other models: one
#: death must leave an intact replica.
AUTO_FLOOR = 2


class SwarmConfig(msgspec.Struct, frozen=True):
    """``layers`` and ``pipelines`` (replicas) of the base model, plus any other models.
    ``pipelines="auto"``: :data:`AUTO_FLOOR` copies first, then, once the other models
    have theirs, every further copy the nodes can form (:class:`ModelSpec` ``auto``).

    ``SwarmConfig(12, 2)``: the first two may be given positionally, as in the seed.
    """

    layers: int
    pipelines: int | Literal["auto"] = 2
    model_id: str = "base"
    models: tuple[ModelSpec, ...] = ()
    failover: FailoverOptions = FailoverOptions()
    executor: str = "toy"  # what computes the base model

    def all_models(self) -> tuple[ModelSpec, ...]:
        base = ModelSpec(
            model_id=self.model_id,
            layers=self.layers,
            role="base",
            replicas=AUTO_FLOOR if self.pipelines == "auto" else self.pipelines,
            executor=self.executor,
            auto=self.pipelines == "auto",
        )
        return (base, *self.models)


class Swarm:
    """Plan + telemetry + policy for one swarm.

    ``policy`` is the chooser to decide through (by default one built from the config's
    failover options); pass one to tune its weights or cold penalty."""

    def __init__(
        self,
        profiles: Iterable[NodeProfile],
        config: SwarmConfig,
        *,
        planner: Planner | str = "greedy",
        policy: Chooser | None = None,
    ) -> None:
        self._setup(config, planner, policy)
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

    @classmethod
    def resume(
        cls,
        plan: SwarmPlan,
        config: SwarmConfig,
        *,
        planner: Planner | str = "greedy",
        policy: Chooser | None = None,
    ) -> Swarm:
        """Carry on from a published plan (another planner's) instead of planning afresh:
        growth and retirement then change it without reshuffling what already serves."""
        swarm = cls.__new__(cls)
        swarm._setup(config, planner, policy)
        swarm.state = SwarmState.from_profiles(plan)
        return swarm

    def _setup(self, config: SwarmConfig, planner: Planner | str, policy: Chooser | None) -> None:
        self.config = config
        self.policy = policy if policy is not None else Chooser(config.failover)
        self.planner = get_planner(planner) if isinstance(planner, str) else planner
        self._observed: SwarmState | None = None
        self._stopped = False

    @property
    def plan(self) -> SwarmPlan:
        return self.state.plan

    # -- routing ---------------------------------------------------------------------

    def route(
        self, request: RoutingRequest = DEFAULT_REQUEST, model_id: str | None = None
    ) -> Route:
        """The route of a new request (see :meth:`choose`)."""
        return self.choose(request, model_id)[0]

    def choose(
        self, request: RoutingRequest = DEFAULT_REQUEST, model_id: str | None = None
    ) -> tuple[Route, bool]:
        """The route of a new request for ``model_id`` (base by default) and whether it is
        degraded: the cheapest intact pipeline, else the best splice of a broken one,
        else the reserve model's route when degradation is allowed.

        Raises :class:`SwarmStopped`, :class:`NoSuchModel` or :class:`NoHealthyPipeline`.
        """
        if self._stopped:
            raise SwarmStopped("the swarm is stopped; start it before routing")
        return self._policy().choose(model_id or self.config.model_id, request)

    def _policy(self) -> Chooser:
        if self._observed is not self.state:  # the state is immutable: observe each once
            # No clock: the swarm raises no suspicions that could lapse.
            self.policy.observe(self.plan, self.state.nodes, now=0.0)
            self._observed = self.state
        return self.policy

    def mark_down(
        self,
        node_id: str,
        request: RoutingRequest = DEFAULT_REQUEST,
        model_id: str | None = None,
    ) -> Recovered | Unrecoverable:
        """Record a death and return the rescue of the route a request for ``model_id``
        (base by default) would have taken."""
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
        # Nothing is kept: the chooser finds the splice again for each new request.
        result = self._policy().rescue(before, node_id, request)
        if was_degraded and isinstance(result, Recovered) and result.route.model_id != model_id:
            # Still the reserve model's answer: untouched by the loss, or moved to another
            # of the reserve's routes, it is degraded all the same.
            kind = "unaffected" if result.kind == "unaffected" else "degraded"
            return replace(result, degraded=True, kind=kind)
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
        """A node joins without a restart; see the growth policy in
        :mod:`hecate.core.growth`."""
        if profile.node_id in self.state.nodes:
            raise DuplicateNode(f"node {profile.node_id!r} is already a member")
        grown = grow(self.state, profile, self.planner)
        self._adopt(grown.state, pipelines=grown.pipelines)
        return Growth(
            node_id=profile.node_id,
            kind=grown.kind,
            pipelines=tuple(p.pipeline_id for p in grown.new),
            epoch=self.plan.epoch,
        )

    def remove_node(self, node_id: str) -> Removal:
        """Retire a node: relocate its layers to spare capacity, rebuild what cannot be."""
        self.state.node(node_id)
        retired = retire(self.state, node_id, self.planner)
        self._adopt(retired.state, pipelines=retired.pipelines)
        return Removal(
            node_id=node_id,
            relocated=retired.relocated,
            dropped=retired.dropped,
            rebuilt=tuple(p.pipeline_id for p in retired.rebuilt),
            epoch=self.plan.epoch,
        )

    def _adopt(self, state: SwarmState, *, pipelines: tuple[Pipeline, ...]) -> None:
        plan = replace(state.plan, epoch=self.plan.epoch + 1, pipelines=pipelines)
        self.state = state.with_plan(plan)
