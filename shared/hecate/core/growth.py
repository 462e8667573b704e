"""Growing and retiring: how the plan changes when a node joins or leaves for good.

Pure functions on a :class:`SwarmState` and its plan; :class:`~hecate.core.swarm.Swarm`
adopts what they return. Existing pipelines are never reshuffled, to avoid churn.

Growth (a node joins):

1. **replica** — the base model has fewer intact pipelines than configured: build the
   missing copies from spare capacity (the newcomer's and what live nodes have left).
2. **expert** — otherwise, a reserve or expert model has fewer pipelines than it asks
   for: host it on spare capacity (the "telomerase" that grows experts).
3. **replica** (auto) — otherwise, a model planned with ``auto`` gets every further
   complete copy that the spare capacity, the newcomer's included, can form.
4. **capacity** — otherwise the newcomer joins as spare capacity, used by later
   relocations and growth; the plan's :meth:`~hecate.core.plan.SwarmPlan.spare_nodes`
   names the nodes that hold no layer.

Retirement (a node leaves): every pipeline that used it is repaired in place by moving
the retiring node's layer ranges to spare capacity on live nodes; a pipeline that cannot
be repaired is dropped, and missing copies are rebuilt from spare capacity where possible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec
from msgspec.structs import replace

from hecate.core.failover import Replacement
from hecate.core.plan import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan, executes
from hecate.core.planners import ROLE_ORDER, Planner
from hecate.core.planning import pipeline_id, renumbered
from hecate.core.state import SwarmState
from hecate.core.telemetry import NodeState

GrowthKind = Literal["replica", "expert", "capacity"]


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


@dataclass(frozen=True, kw_only=True)
class Grown:
    """The state with the newcomer in it, and the pipelines to adopt."""

    state: SwarmState
    kind: GrowthKind
    new: tuple[Pipeline, ...]
    pipelines: tuple[Pipeline, ...]


@dataclass(frozen=True, kw_only=True)
class Retired:
    """The state without the retired node, and the pipelines to adopt."""

    state: SwarmState
    relocated: tuple[Replacement, ...]
    dropped: tuple[str, ...]
    rebuilt: tuple[Pipeline, ...]
    pipelines: tuple[Pipeline, ...]


def grow(state: SwarmState, profile: NodeProfile, planner: Planner) -> Grown:
    """``profile`` joins; see the growth policy in the module doc."""
    plan = state.plan
    grown = replace(plan, nodes=(*plan.nodes, profile))
    state = state.with_plan(grown).with_node(
        profile.node_id, NodeState(latency_ms=profile.latency_ms, score=profile.score)
    )
    kind: GrowthKind = "capacity"
    new: list[Pipeline] = []
    models = sorted(plan.models, key=lambda m: (ROLE_ORDER[m.role], m.model_id))
    for m in models:
        new = build_missing(planner, m, state, grown)
        if new:
            kind = "replica" if m.role == "base" else "expert"
            break
        if m.role == "base" and executes(profile.executor, m) and missing(m, state, grown) > 0:
            # The base is short of copies and this node cannot complete one yet: keep it
            # as spare for the base rather than spend it on another model (unless it
            # cannot run the base at all).
            break
    else:
        for m in (m for m in models if m.auto):
            new = build_extra(planner, m, state, grown)
            if new:
                kind = "replica"
                break
    return Grown(state=state, kind=kind, new=tuple(new), pipelines=(*plan.pipelines, *new))


def retire(state: SwarmState, node_id: str, planner: Planner) -> Retired:
    """``node_id`` leaves for good: relocate its layers, rebuild what cannot be."""
    before = state.plan
    without = replace(
        before, nodes=tuple(n for n in before.nodes if n.node_id != node_id)
    )  # every old pipeline still counted, so spare capacity is not double-booked
    state = state.with_plan(without)
    free = spare(state, without)
    pipelines: list[Pipeline] = []
    relocated: list[Replacement] = []
    dropped: list[str] = []
    for p in before.pipelines:
        if node_id not in p.node_ids:
            pipelines.append(p)
            continue
        repaired = relocate(p, node_id, free, state)
        if repaired is not None:
            pipelines.append(repaired[0])
            relocated += repaired[1]
            continue
        dropped.append(p.pipeline_id)
        for s in p.stages:  # a dropped pipeline gives its layers back
            if s.node_id != node_id and state.is_alive(s.node_id):
                free[s.node_id] = free.get(s.node_id, 0) + s.size
    rebuilt: list[Pipeline] = []
    models = sorted(before.models, key=lambda m: (ROLE_ORDER[m.role], m.model_id))
    for m in models:
        rebuilt += build_missing(
            planner, m, state, replace(without, pipelines=(*pipelines, *rebuilt))
        )
    for m in (m for m in models if m.auto):
        rebuilt += build_extra(
            planner, m, state, replace(without, pipelines=(*pipelines, *rebuilt))
        )
    return Retired(
        state=state,
        relocated=tuple(relocated),
        dropped=tuple(dropped),
        rebuilt=tuple(rebuilt),
        pipelines=(*pipelines, *rebuilt),
    )


def missing(model: ModelSpec, state: SwarmState, plan: SwarmPlan) -> int:
    """How many intact copies ``model`` lacks of its replica target."""
    intact = sum(1 for p in plan.pipelines_of(model.model_id) if state.pipeline_alive(p))
    return model.replicas - intact


def build_extra(
    planner: Planner, model: ModelSpec, state: SwarmState, plan: SwarmPlan
) -> list[Pipeline]:
    """Every further copy of an ``auto`` model that spare live capacity can form."""
    profiles = {n.node_id: n for n in plan.nodes}
    return planner.extra(model, plan.pipelines, spare(state, plan), profiles)


def build_missing(
    planner: Planner, model: ModelSpec, state: SwarmState, plan: SwarmPlan
) -> list[Pipeline]:
    """New pipelines of ``model`` from spare live capacity, up to its replica target."""
    short = missing(model, state, plan)
    if short <= 0:
        return []
    mine = plan.pipelines_of(model.model_id)
    intact = [p for p in mine if state.pipeline_alive(p)]
    profiles = {n.node_id: n for n in plan.nodes}
    taken = {p.pipeline_id for p in mine}
    first = 0
    while pipeline_id(model.model_id, first) in taken:
        first += 1
    avoid = frozenset(n for p in intact for n in p.node_ids)
    new = planner.copies(model, short, spare(state, plan), profiles, first_index=first, avoid=avoid)
    return renumbered(new, taken, first)


def spare(state: SwarmState, plan: SwarmPlan) -> dict[str, int]:
    """Layer capacity each *live* node has left under ``plan``."""
    used = plan.layers_used()
    return {
        n.node_id: n.capacity_layers - used.get(n.node_id, 0)
        for n in plan.nodes
        if state.is_alive(n.node_id) and n.capacity_layers > used.get(n.node_id, 0)
    }


def relocate(
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
