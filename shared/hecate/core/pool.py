"""Best-fit machinery the planner strategies share: a pool of nodes with free layers
and the chain of stages that fills one copy of a model from it."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, MutableMapping

from hecate.core.plan import NodeProfile, Stage


class Pool:
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


def pick(need: int, *pools: Pool) -> tuple[str, Pool] | None:
    """The node to take next: the smallest that finishes the copy, else the roomiest.

    Finishing with the smallest sufficient node (best fit) keeps roomy nodes for the next
    copies, so replicas stay on disjoint nodes more often; pools are tried in order.
    """
    for pool in pools:
        node_id = pool.fitting(need) or pool.largest()
        if node_id is not None:
            return node_id, pool
    return None


def chain(
    layers: int,
    free: MutableMapping[str, int],
    fresh: Pool,
    reused: Pool,
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
        picked = pick(layers - at, fresh, reused)
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
