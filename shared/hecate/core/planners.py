"""Planner strategies: who runs which layers. Swappable behind one small interface.

A planner turns models and node profiles into a :class:`SwarmPlan`. Models are planned
in priority order, base first (it is what the swarm exists for), then the reserve (the
safety net), then experts (grown onto whatever capacity is left). Within a model, each
replica prefers nodes no other replica of that model uses, so one death breaks one copy.
Plans are deterministic: the same input gives the same plan, whatever the input order.

Strategies:

* ``greedy`` fills the roomiest node first, contiguously, so pipelines have few hops.
* ``proportional`` partitions nodes into balanced groups, one per replica, and gives
  each node of a group a layer share proportional to its capacity (as exo does with
  memory): more hops, but no node is filled to the brim while others idle.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, MutableMapping
from typing import ClassVar

from hecate.core.errors import UnknownPlanner
from hecate.core.plan import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan

ROLE_ORDER = {"base": 0, "reserve": 1, "expert": 2}


def pipeline_id(model_id: str, index: int) -> str:
    return f"{model_id}-r{index}"


class Planner(ABC):
    """A strategy. Subclasses implement :meth:`replicas`; :meth:`plan` is shared."""

    name: ClassVar[str]

    def plan(
        self, models: Iterable[ModelSpec], nodes: Iterable[NodeProfile], *, epoch: int = 1
    ) -> SwarmPlan:
        """Plan every model, as many replicas as each asks for and capacity allows.

        Never raises for lack of capacity: a model gets fewer replicas (possibly none).
        The caller decides whether that is acceptable (see ``InsufficientCapacity``).
        """
        models = tuple(models)
        profiles = {n.node_id: n for n in sorted(nodes, key=lambda n: n.node_id)}
        free = {i: n.capacity_layers for i, n in profiles.items()}
        pipelines: list[Pipeline] = []
        for m in sorted(models, key=lambda m: (ROLE_ORDER[m.role], m.model_id)):
            pipelines += self.replicas(m, m.replicas, free, profiles, first_index=0)
        return SwarmPlan(
            epoch=epoch, models=models, nodes=tuple(profiles.values()), pipelines=tuple(pipelines)
        )

    @abstractmethod
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
        """Up to ``count`` new pipelines of ``model`` from the ``free`` layer capacity.

        Consumes what it uses from ``free``. Nodes in ``avoid`` (already serving this
        model) are used only when nothing else fits. Pipeline ids start at ``first_index``.
        """


class GreedyPlanner(Planner):
    """Fill the roomiest node first; fewest hops per pipeline."""

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
        used = set(avoid)

        def key(node_id: str) -> tuple[bool, int, float, str]:
            return (node_id in used, -free[node_id], profiles[node_id].latency_ms, node_id)

        heap = [key(i) for i in profiles if free.get(i, 0) > 0]
        heapq.heapify(heap)
        out: list[Pipeline] = []
        for index in range(first_index, first_index + count):
            stages: list[Stage] = []
            at = 0
            while at < model.layers and heap:
                *_, node_id = heapq.heappop(heap)
                take = min(free[node_id], model.layers - at)
                stages.append(Stage(node_id=node_id, layer_start=at, layer_end=at + take))
                free[node_id] -= take
                at += take
            if at < model.layers:  # not enough capacity left for a whole copy: undo it
                for s in stages:
                    free[s.node_id] += s.size
                break
            used.update(s.node_id for s in stages)
            for s in stages:
                if free[s.node_id] > 0:
                    heapq.heappush(heap, key(s.node_id))
            out.append(
                Pipeline(
                    pipeline_id=pipeline_id(model.model_id, index),
                    model_id=model.model_id,
                    stages=tuple(stages),
                )
            )
        return out


class ProportionalPlanner(Planner):
    """Balanced node groups, one per replica; layers split in proportion to capacity."""

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
        fresh = [i for i in profiles if free.get(i, 0) > 0 and i not in avoid]
        reused = [i for i in profiles if free.get(i, 0) > 0 and i in avoid]
        groups: list[list[str]] = []
        for pool in (fresh, fresh + reused):
            k = min(count, sum(free[i] for i in pool) // model.layers)
            while k > 0:
                groups = _balanced_groups(pool, free, k)
                if all(sum(free[i] for i in g) >= model.layers for g in groups):
                    break
                k -= 1
            if groups and k > 0:
                break
            groups = []
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


def _balanced_groups(pool: list[str], free: Mapping[str, int], k: int) -> list[list[str]]:
    """Longest-processing-time partition: each node, roomiest first, joins the emptiest group."""
    heap = [(0, g) for g in range(k)]
    groups: list[list[str]] = [[] for _ in range(k)]
    for node_id in sorted(pool, key=lambda i: (-free[i], i)):
        total, g = heapq.heappop(heap)
        groups[g].append(node_id)
        heapq.heappush(heap, (total + free[node_id], g))
    return groups


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
