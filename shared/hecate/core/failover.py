"""What to do when a node on a route dies, strictly in this order:

1. **Intact replica**: another pipeline of the same model with every node alive. A
   replica was planned and is guaranteed contiguous, so it beats anything improvised.
2. **Per-layer splice**: every lost layer range is held by another live node (in some
   other pipeline of the same model); the dead stages are swapped for those nodes and
   the rest of the route is kept. Not degraded, but not a planned pipeline either.
3. **Degradation**, only when the options allow it: the designated reserve model (role
   ``reserve``; an expert never stands in for the base) on surviving nodes, flagged
   ``degraded`` so the response contract can say so.
4. Otherwise :class:`Unrecoverable`, returned as a value: an explicit, controlled
   outcome is better than an invalid route.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from hecate.core.cost import (
    DEFAULT_PENALTY,
    DEFAULT_WEIGHTS,
    ColdPenalty,
    RouteWeights,
    hop_cost,
    stage_cost,
    token_cost,
)
from hecate.core.errors import RoutingError, Unrecoverable
from hecate.core.plan import Stage
from hecate.core.routing import DEFAULT_REQUEST, Route, RoutingRequest, route_request
from hecate.core.state import SwarmState

RecoveryKind = Literal["unaffected", "replica", "splice", "degraded"]


class FailoverOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a degraded answer is acceptable, and from which reserve model."""

    allow_degraded: bool = False
    reserve_model: str | None = None


class Replacement(msgspec.Struct, frozen=True, kw_only=True):
    """Layers ``[layer_start, layer_end)`` moved from ``old_node`` to ``new_node``."""

    layer_start: int
    layer_end: int
    old_node: str
    new_node: str


class Recovered(msgspec.Struct, frozen=True, kw_only=True):
    """A correct route after a loss. ``kind`` says how it was found.

    ``unaffected`` means the lost node was not on the route, which stays as it was.
    """

    kind: RecoveryKind
    degraded: bool
    replaced: tuple[Replacement, ...]
    route: Route


def failover_in_swarm(
    route: Route,
    lost_node: str,
    state: SwarmState,
    options: FailoverOptions = FailoverOptions(),  # noqa: B008 (frozen, immutable)
    *,
    request: RoutingRequest = DEFAULT_REQUEST,
    weights: RouteWeights = DEFAULT_WEIGHTS,
    penalty: ColdPenalty = DEFAULT_PENALTY,
) -> Recovered | Unrecoverable:
    """Rescue ``route`` after ``lost_node`` died (treated as down whatever ``state`` says).

    Any other node of the route that ``state`` reports down is replaced too.
    """

    def down(node_id: str) -> bool:
        return node_id == lost_node or not state.is_alive(node_id)

    if not any(down(s.node_id) for s in route.stages):
        return Recovered(kind="unaffected", degraded=False, replaced=(), route=route)

    for base, pid, p in state.cost_table(route.model_id, weights, penalty):
        if not any(down(s.node_id) for s in p.stages):
            rescue = Route(
                model_id=route.model_id,
                pipeline_id=pid,
                cost=base + token_cost(request.tokens, weights),
                stages=p.stages,
            )
            return Recovered(kind="replica", degraded=False, replaced=(), route=rescue)

    spliced = _splice(route, down, state, weights, penalty)
    if spliced is not None:
        stages, replaced = spliced
        cost = hop_cost(len(stages), weights) + token_cost(request.tokens, weights)
        for s in stages:
            cost += stage_cost(state.node(s.node_id), state.profile(s.node_id), weights, penalty)
        rescue = Route(
            model_id=route.model_id,
            pipeline_id=f"{route.pipeline_id.split('~')[0]}~splice",
            cost=cost,
            stages=stages,
        )
        return Recovered(kind="splice", degraded=False, replaced=replaced, route=rescue)

    # A request that waited for a route asks again naming no new loss: the nodes of its
    # route that are down are what it lost (a message naming node '' says nothing).
    lost_node = lost_node or next(s.node_id for s in route.stages if down(s.node_id))
    why = (
        f"node {lost_node!r} was lost from {route.pipeline_id}; no intact replica of "
        f"{route.model_id!r} and no live node holds every lost layer range"
    )
    if not options.allow_degraded:
        return Unrecoverable(
            f"{why}; degradation is not allowed", model_id=route.model_id, lost_node=lost_node
        )
    return _degrade(route, lost_node, state, options, request, weights, penalty, why)


def _splice(
    route: Route,
    down: Callable[[str], bool],
    state: SwarmState,
    weights: RouteWeights,
    penalty: ColdPenalty,
) -> tuple[tuple[Stage, ...], tuple[Replacement, ...]] | None:
    holdings = [
        s for p in state.plan.pipelines_of(route.model_id) for s in p.stages if not down(s.node_id)
    ]

    def node_cost(node_id: str) -> float:
        return stage_cost(state.node(node_id), state.profile(node_id), weights, penalty)

    stages: list[Stage] = []
    replaced: list[Replacement] = []
    for lost in route.stages:
        if not down(lost.node_id):
            stages.append(lost)
            continue
        at = lost.layer_start
        while at < lost.layer_end:
            # Furthest reach first (fewest hops), then cheapest node, then id: deterministic.
            options = [h for h in holdings if h.layer_start <= at < h.layer_end]
            if not options:
                return None
            best = min(
                options,
                key=lambda h: (-min(h.layer_end, lost.layer_end), node_cost(h.node_id), h.node_id),
            )
            end = min(best.layer_end, lost.layer_end)
            stages.append(Stage(node_id=best.node_id, layer_start=at, layer_end=end))
            replaced.append(
                Replacement(
                    layer_start=at, layer_end=end, old_node=lost.node_id, new_node=best.node_id
                )
            )
            at = end
    return tuple(stages), tuple(replaced)


def _degrade(
    route: Route,
    lost_node: str,
    state: SwarmState,
    options: FailoverOptions,
    request: RoutingRequest,
    weights: RouteWeights,
    penalty: ColdPenalty,
    why: str,
) -> Recovered | Unrecoverable:
    reserve_id = options.reserve_model
    reserve = state.plan.model(reserve_id) if reserve_id else None
    if reserve_id is None or reserve is None:
        reason = (
            "no reserve model is configured"
            if reserve_id is None
            else (f"reserve model {reserve_id!r} is not in the plan")
        )
        return Unrecoverable(
            f"{why}; degradation is allowed but {reason}",
            model_id=route.model_id,
            lost_node=lost_node,
        )
    if reserve_id == route.model_id:
        # The request was already the degraded answer: there is no reserve of the reserve.
        return Unrecoverable(
            f"{why}; {route.model_id!r} is the reserve model, already standing in for the "
            f"model asked for, and there is no further fallback",
            model_id=route.model_id,
            lost_node=lost_node,
        )
    if reserve.role != "reserve":
        return Unrecoverable(
            f"{why}; model {reserve_id!r} has role {reserve.role!r} and cannot stand in "
            f"for {route.model_id!r} (only a model with role 'reserve' can)",
            model_id=route.model_id,
            lost_node=lost_node,
        )
    survivors = state.mark(lost_node, alive=False) if lost_node in state.nodes else state
    try:
        rescue = route_request(reserve_id, request, survivors, weights, penalty)
    except RoutingError:
        planned = survivors.plan.pipelines_of(reserve_id)
        down = sorted(
            {s.node_id for p in planned for s in p.stages if not survivors.is_alive(s.node_id)}
        )
        reason = (
            f"every pipeline of it has a node down ({', '.join(down)})"
            if planned
            else "it has no pipeline in the plan"
        )
        return Unrecoverable(
            f"{why}; the reserve model {reserve_id!r} cannot stand in either: {reason}",
            model_id=route.model_id,
            lost_node=lost_node,
        )
    return Recovered(kind="degraded", degraded=True, replaced=(), route=rescue)
