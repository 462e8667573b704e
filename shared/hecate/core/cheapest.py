"""One model's healthy pipelines by what each costs now, the cheapest on top.

A router's decision is the least ``(cost, pipeline_id)`` over a model's healthy
pipelines, where a pipeline's cost is its base (from the snapshot) plus this router's
own in-flight work on it plus its link term (from the round trips it measured; see
:class:`hecate.core.router.Router`). Walking every pipeline is linear in the copies: at
833 copies with 32 requests in flight, 35-55 µs a decision. Here the costs sit in a
heap, and a decision looks at its top.

A cost changes for three reasons, each of which makes the pipeline's entry stale and
the pipeline due for a new one before the next decision: a dispatch begins or ends on
one of its nodes, a round trip is measured on it (:meth:`Cheapest.touch` for both), or
time passes the instant its link term holds until (a measurement window closing: kept
in a second heap of expiries). A stale entry is dropped when it reaches the top. A new
snapshot changes every base: the router makes a new one. So a decision costs the
pipelines that changed since the last one, ``O(log n)`` each, plus the top.

Pure: the router hands it the cost of a pipeline at an instant.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable

#: A pipeline's cost at an instant, and until when it holds with nothing else changing.
CostNow = Callable[[str, float], tuple[float, float]]


class Cheapest:
    """The pipelines ``pipeline_ids`` of one model by ``cost``, as of the latest
    decision (see the module's doc)."""

    def __init__(self, pipeline_ids: Iterable[str], cost: CostNow) -> None:
        self._cost = cost
        self._version: dict[str, int] = {}
        self._heap: list[tuple[float, str, int]] = []  # (cost, pipeline, version)
        self._expiry: list[tuple[float, str, int]] = []  # (until, pipeline, version)
        self._due: set[str] = set(pipeline_ids)
        self._known = frozenset(self._due)
        self._at = -math.inf  # the latest decision's instant

    def touch(self, pipeline_id: str) -> None:
        """``pipeline_id``'s cost changed (a dispatch on it, a round trip measured); a
        pipeline not among these (one that is not healthy) is no concern here."""
        if pipeline_id in self._known:
            self._due.add(pipeline_id)

    def pick(self, at: float, full: Collection[str] = ()) -> tuple[float, str] | None:
        """The least ``(cost, pipeline_id)`` at ``at`` among the pipelines not in
        ``full``; None when every one is."""
        if at < self._at:  # an earlier instant: what was kept may not hold there
            self._due.update(self._version)
            self._expiry.clear()
        self._at = at
        expiry = self._expiry
        while expiry and expiry[0][0] <= at:
            _until, pid, version = heapq.heappop(expiry)
            if self._version.get(pid) == version:
                self._due.add(pid)
        for pid in self._due:
            self._push(pid, at)
        self._due.clear()
        if len(self._heap) > 2 * len(self._version) + 64:
            self._compact()
        heap, skipped, answer = self._heap, [], None
        while heap:
            cost, pid, version = heap[0]
            if self._version[pid] != version:
                heapq.heappop(heap)
            elif pid in full:
                skipped.append(heapq.heappop(heap))
            else:
                answer = cost, pid
                break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return answer

    def _compact(self) -> None:
        """Drop the stale entries below the top (each change leaves one)."""
        current = self._version
        self._heap = [e for e in self._heap if current[e[1]] == e[2]]
        heapq.heapify(self._heap)
        self._expiry = [e for e in self._expiry if current[e[1]] == e[2]]
        heapq.heapify(self._expiry)

    def _push(self, pid: str, at: float) -> None:
        version = self._version.get(pid, 0) + 1
        self._version[pid] = version
        cost, until = self._cost(pid, at)
        heapq.heappush(self._heap, (cost, pid, version))
        if until < math.inf:
            heapq.heappush(self._expiry, (until, pid, version))
