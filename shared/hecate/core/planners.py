"""Planner strategies: who runs which layers. Swappable behind one small interface.

A planner turns models and node profiles into a :class:`SwarmPlan`. Models are planned
in priority order, base first (it is what the swarm exists for), then the reserve (the
safety net), then experts (grown onto whatever capacity is left). Within a model, each
replica prefers nodes no other replica of that model uses, so one death breaks one copy.
Plans are deterministic: the same input gives the same plan, whatever the input order.
A model's layers go only to nodes that run its executor (:func:`~hecate.core.plan.executes`):
a model no node can execute is not planned at all, rather than served by another network
under its name.

Strategies:

* ``greedy`` fills the roomiest node first and finishes each copy with the smallest
  node that completes it (best fit), so pipelines have few hops and roomy nodes are
  left for the next copy.
* ``proportional`` seeds one node group per replica the same way, hands every leftover
  node to the group with the least capacity, and gives each node of a group a layer
  share proportional to its capacity (as exo does with memory): more hops, but no node
  is filled to the brim while others idle.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, MutableMapping

from hecate.core.errors import UnknownPlanner
from hecate.core.plan import ModelSpec, NodeProfile, Pipeline, Stage
from hecate.core.planning import ROLE_ORDER, Planner, executors_for, pipeline_id, unexecutable
from hecate.core.pool import Pool, chain

__all__ = [
    "PLANNERS",
    "ROLE_ORDER",
    "GreedyPlanner",
    "Planner",
    "ProportionalPlanner",
    "executors_for",
    "get_planner",
    "pipeline_id",
    "unexecutable",
]


class GreedyPlanner(Planner):
    """Fill the roomiest node first and finish with the smallest that fits: few hops."""

    name = "greedy"

    def replicas(
        self,
        model: ModelSpec,
        count: int,
        free: MutableMapping[str, int],
        profiles: Mapping[str, NodeProfile],
        *,
        first_index: int,
        avoid: frozenset[str] = frozenset(),
    ) -> list[Pipeline]:
        fresh = Pool((i for i in profiles if i not in avoid), free, profiles)
        reused = Pool((i for i in profiles if i in avoid), free, profiles)
        out: list[Pipeline] = []
        for index in range(first_index, first_index + count):
            stages = chain(model.layers, free, fresh, reused)
            if stages is None:
                break
            out.append(
                Pipeline(
                    pipeline_id=pipeline_id(model.model_id, index),
                    model_id=model.model_id,
                    stages=stages,
                )
            )
        return out


class ProportionalPlanner(Planner):
    """One node group per replica; layers split in proportion to capacity within it."""

    name = "proportional"

    def replicas(
        self,
        model: ModelSpec,
        count: int,
        free: MutableMapping[str, int],
        profiles: Mapping[str, NodeProfile],
        *,
        first_index: int,
        avoid: frozenset[str] = frozenset(),
    ) -> list[Pipeline]:
        # Seed each group like greedy does (roomiest first, best fit to finish), then
        # hand every node left over to the group with the least capacity, so all nodes
        # share the work as exo's memory-weighted ring does.
        scratch = dict(free)
        fresh = Pool((i for i in profiles if i not in avoid), scratch, profiles)
        reused = Pool((i for i in profiles if i in avoid), scratch, profiles)
        groups: list[list[str]] = []
        for _ in range(count):
            # A node joins one group only: its whole free capacity is that group's.
            seed = chain(model.layers, scratch, fresh, reused, keep_used=False)
            if seed is None:
                break
            groups.append([s.node_id for s in seed])
        if not groups:
            return []
        in_group = {i for g in groups for i in g}
        leftovers = sorted(
            (i for i in profiles if free.get(i, 0) > 0 and i not in in_group and i not in avoid),
            key=lambda i: (-free[i], i),
        )
        heap = [(sum(free[i] for i in g), n) for n, g in enumerate(groups)]
        heapq.heapify(heap)
        for node_id in leftovers:
            total, n = heapq.heappop(heap)
            groups[n].append(node_id)
            heapq.heappush(heap, (total + free[node_id], n))
        out: list[Pipeline] = []
        for index, group in enumerate(groups, start=first_index):
            stages = _proportional_split(model.layers, group, free, profiles)
            for s in stages:
                free[s.node_id] -= s.size
            out.append(
                Pipeline(
                    pipeline_id=pipeline_id(model.model_id, index),
                    model_id=model.model_id,
                    stages=stages,
                )
            )
        return out


def _proportional_split(
    layers: int, group: list[str], free: Mapping[str, int], profiles: Mapping[str, NodeProfile]
) -> tuple[Stage, ...]:
    """Largest-remainder apportionment of ``layers`` by free capacity, capped by it."""
    total = sum(free[i] for i in group)
    shares = {i: layers * free[i] // total for i in group}
    remainders = sorted(group, key=lambda i: (-(layers * free[i] % total), -free[i], i))
    left = layers - sum(shares.values())
    for i in remainders:
        if left == 0:
            break
        if shares[i] < free[i]:
            shares[i] += 1
            left -= 1
    order = sorted(
        (i for i in group if shares[i] > 0), key=lambda i: (-shares[i], profiles[i].latency_ms, i)
    )
    stages: list[Stage] = []
    at = 0
    for i in order:
        stages.append(Stage(node_id=i, layer_start=at, layer_end=at + shares[i]))
        at += shares[i]
    return tuple(stages)


PLANNERS: dict[str, type[Planner]] = {
    GreedyPlanner.name: GreedyPlanner,
    ProportionalPlanner.name: ProportionalPlanner,
}


def get_planner(name: str) -> Planner:
    """The strategy registered as ``name``; :class:`UnknownPlanner` lists the known ones."""
    try:
        return PLANNERS[name]()
    except KeyError:
        raise UnknownPlanner(
            f"no planner named {name!r}; known planners: {', '.join(sorted(PLANNERS))}"
        ) from None
