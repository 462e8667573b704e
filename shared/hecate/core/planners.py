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

import bisect
import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, MutableMapping
from typing import ClassVar

from hecate.core.errors import UnknownPlanner
from hecate.core.plan import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan, executes

ROLE_ORDER = {"base": 0, "reserve": 1, "expert": 2}


def pipeline_id(model_id: str, index: int) -> str:
    return f"{model_id}-r{index}"


def executors_for(model: ModelSpec, profiles: Mapping[str, NodeProfile]) -> dict[str, NodeProfile]:
    """The profiles of the nodes that may be given layers of ``model``."""
    return {i: n for i, n in profiles.items() if executes(n.executor, model)}


def unexecutable(
    models: Iterable[ModelSpec], nodes: Iterable[NodeProfile]
) -> list[tuple[ModelSpec, tuple[str, ...]]]:
    """Each model no node among ``nodes`` can execute, with the executors present."""
    nodes = tuple(nodes)
    present = tuple(sorted({n.executor for n in nodes}))
    return [(m, present) for m in models if not any(executes(n.executor, m) for n in nodes)]


class Planner(ABC):
    """A strategy. Subclasses implement :meth:`replicas`; :meth:`plan` and :meth:`copies`
    are shared, and are what callers use: they hand the strategy only the nodes that run
    the model's executor, so no strategy can get that wrong."""

    name: ClassVar[str]

    def plan(
        self, models: Iterable[ModelSpec], nodes: Iterable[NodeProfile], *, epoch: int = 1
    ) -> SwarmPlan:
        """Plan every model, as many replicas as each asks for and capacity allows.

        Never raises for lack of capacity: a model gets fewer replicas (possibly none).
        The caller decides whether that is acceptable (see ``InsufficientCapacity``).
        """
        models = tuple(sorted(models, key=lambda m: (ROLE_ORDER[m.role], m.model_id)))
        profiles = {n.node_id: n for n in sorted(nodes, key=lambda n: n.node_id)}
        free = {i: n.capacity_layers for i, n in profiles.items()}
        pipelines: list[Pipeline] = []
        for m in models:
            pipelines += self.copies(m, m.replicas, free, profiles, first_index=0)
        return SwarmPlan(
            epoch=epoch, models=models, nodes=tuple(profiles.values()), pipelines=tuple(pipelines)
        )

    def copies(
        self,
        model: ModelSpec,
        count: int,
        free: MutableMapping[str, int],
        profiles: Mapping[str, NodeProfile],
        *,
        first_index: int,
        avoid: frozenset[str] = frozenset(),
    ) -> list[Pipeline]:
        """:meth:`replicas` of ``model`` on the nodes of ``profiles`` that execute it."""
        eligible = executors_for(model, profiles)
        if not eligible:
            return []
        return self.replicas(model, count, free, eligible, first_index=first_index, avoid=avoid)

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


class _Pool:
    """Nodes with free layers, sorted by (free, latency, id): O(log n) best fit.

    ``largest()`` is the roomiest node (lowest latency, then id, among equals);
    ``fitting(need)`` the smallest node with at least ``need`` free layers.
    """

    def __init__(
        self, ids: Iterable[str], free: Mapping[str, int], profiles: Mapping[str, NodeProfile]
    ) -> None:
        self._free = free
        self._profiles = profiles
        self._keys = sorted(self._key(i) for i in ids if free.get(i, 0) > 0)
        self._total = sum(k[0] for k in self._keys)

    def _key(self, node_id: str) -> tuple[int, float, str]:
        return (self._free[node_id], self._profiles[node_id].latency_ms, node_id)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def total(self) -> int:
        """Free layers across the pool (kept up to date, not recomputed)."""
        return self._total

    def largest(self) -> str | None:
        if not self._keys:
            return None
        i = bisect.bisect_left(self._keys, (self._keys[-1][0], -math.inf, ""))
        return self._keys[i][2]

    def fitting(self, need: int) -> str | None:
        i = bisect.bisect_left(self._keys, (need, -math.inf, ""))
        return self._keys[i][2] if i < len(self._keys) else None

    def remove(self, node_id: str) -> None:
        key = self._key(node_id)
        i = bisect.bisect_left(self._keys, key)
        if i < len(self._keys) and self._keys[i] == key:
            del self._keys[i]
            self._total -= key[0]

    def add(self, node_id: str) -> None:
        if self._free[node_id] > 0:
            key = self._key(node_id)
            bisect.insort(self._keys, key)
            self._total += key[0]


def _pick(need: int, *pools: _Pool) -> tuple[str, _Pool] | None:
    """The node to take next: the smallest that finishes the copy, else the roomiest.

    Finishing with the smallest sufficient node (best fit) keeps roomy nodes for the next
    copies, so replicas stay on disjoint nodes more often; pools are tried in order.
    """
    for pool in pools:
        node_id = pool.fitting(need) or pool.largest()
        if node_id is not None:
            return node_id, pool
    return None


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
        fresh = _Pool((i for i in profiles if i not in avoid), free, profiles)
        reused = _Pool((i for i in profiles if i in avoid), free, profiles)
        out: list[Pipeline] = []
        for index in range(first_index, first_index + count):
            stages = _chain(model.layers, free, fresh, reused)
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


def _chain(
    layers: int,
    free: MutableMapping[str, int],
    fresh: _Pool,
    reused: _Pool,
    *,
    keep_used: bool = True,
) -> tuple[Stage, ...] | None:
    """One contiguous copy from the pools (built over ``free``), consuming ``free``; None
    (and nothing consumed) when the pools cannot hold it. Nodes it uses leave ``fresh``
    and, with ``keep_used``, join ``reused`` with whatever room they have left."""
    if fresh.total() + reused.total() < layers:
        return None
    stages: list[Stage] = []
    at = 0
    while at < layers:
        picked = _pick(layers - at, fresh, reused)
        assert picked is not None  # the totals above guarantee room
        node_id, pool = picked
        pool.remove(node_id)
        take = min(free[node_id], layers - at)
        stages.append(Stage(node_id=node_id, layer_start=at, layer_end=at + take))
        free[node_id] -= take
        at += take
    if keep_used:
        for s in stages:
            reused.add(s.node_id)
    return tuple(stages)


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
        fresh = _Pool((i for i in profiles if i not in avoid), scratch, profiles)
        reused = _Pool((i for i in profiles if i in avoid), scratch, profiles)
        groups: list[list[str]] = []
        for _ in range(count):
            # A node joins one group only: its whole free capacity is that group's.
            seed = _chain(model.layers, scratch, fresh, reused, keep_used=False)
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
