"""Choosing a pipeline for a request.

Rules, in order:

1. The model must match exactly. Serving another model is a wrong answer, not a
   degraded one: other dimensions, other layers.
2. Pipelines with any node down are skipped. Half a copy is not a copy.
3. The lowest cost wins; ties are broken by ``pipeline_id`` so that two consecutive
   runs choose the same copy.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from hecate.core.cost import DEFAULT_PENALTY, DEFAULT_WEIGHTS, ColdPenalty, RouteWeights, token_cost
from hecate.core.errors import NoHealthyPipeline, NoSuchModel
from hecate.core.plan import Stage
from hecate.core.state import SwarmState


class RoutingRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the router needs to know of a request: its size in tokens, and per pipeline
    the tokens of its prompt that pipeline's nodes likely keep cached (a prefix of the
    same tenant's earlier prompt): they are not computed there, so not costed there.
    ``saves``: where known, what not computing them saves there, in the cost's own
    units (the milliseconds that pipeline was measured to take for as many prompt
    positions); a pipeline in ``cached`` but not here saves their token term."""

    tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    cached: dict[str, int] = msgspec.field(default_factory=dict)
    saves: dict[str, float] = msgspec.field(default_factory=dict)


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """The chain of stages a request will travel, and what it was estimated to cost."""

    model_id: str
    pipeline_id: str
    cost: float
    stages: tuple[Stage, ...]

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(s.node_id for s in self.stages)


DEFAULT_REQUEST = RoutingRequest()


def route_request(
    model_id: str,
    request: RoutingRequest,
    state: SwarmState,
    weights: RouteWeights = DEFAULT_WEIGHTS,
    penalty: ColdPenalty = DEFAULT_PENALTY,
) -> Route:
    """The cheapest healthy pipeline of exactly ``model_id``.

    Raises :class:`NoSuchModel` when the plan has no pipeline of that model, and
    :class:`NoHealthyPipeline` when every one of them has a node down. Never returns a
    pipeline of another model, whatever the load.
    """
    table = state.cost_table(model_id, weights, penalty)
    if not table:
        raise no_route_error(model_id, state)
    cost, pipeline_id, pipeline = table[0]
    return Route(
        model_id=model_id,
        pipeline_id=pipeline_id,
        cost=cost + token_cost(request.tokens, weights),
        stages=pipeline.stages,
    )


def no_route_error(model_id: str, state: SwarmState) -> NoSuchModel | NoHealthyPipeline:
    """Why ``model_id`` has no healthy pipeline in ``state``, as the error to raise."""
    planned = state.plan.pipelines_of(model_id)
    if not planned:
        served = sorted({p.model_id for p in state.plan.pipelines})
        known = "is not in the plan" if state.plan.model(model_id) is None else "has no pipeline"
        return NoSuchModel(
            f"model {model_id!r} {known} (epoch {state.plan.epoch}); "
            f"models served: {', '.join(served) or 'none'}"
        )
    down = sorted({s.node_id for p in planned for s in p.stages if not state.is_alive(s.node_id)})
    return NoHealthyPipeline(
        f"all {len(planned)} pipelines of {model_id!r} have a node down "
        f"(down: {', '.join(down)}); bring a node back or run failover"
    )
