"""The router's admission desk: requests in flight per pipeline, and the line for room.

No I/O here; the router feeds it and carries out what it says. Per pipeline, the core's
:class:`AdaptiveLimit` says how many requests it may carry (learned from that
pipeline's own step times) and the desk counts how many it carries now; per model, a
:class:`FairQueue` holds the requests that found every healthy pipeline full, in turn
per tenant, until a flight lands and makes room, or until they have waited
``max_wait_s`` (then they are refused as ``rate_limited``, with a Retry-After worked
out from the line ahead of them and the rate requests are finishing at).

This router's own flights are what it counts: replicas of the router each keep their
own desk, and since every replica measures the same pipelines' step times, their limits
agree without talking to each other.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from hecate.core.admission import (
    DEFAULT_LIMIT,
    AdaptiveLimit,
    FairQueue,
    LimitOptions,
    Throughput,
    retry_after_s,
)

T = TypeVar("T")


@dataclass(slots=True)
class _Model(Generic[T]):
    queue: FairQueue[T]
    finishing: Throughput = field(default_factory=Throughput)


class AdmissionDesk(Generic[T]):
    def __init__(
        self,
        *,
        limits: LimitOptions = DEFAULT_LIMIT,
        queue_limit: int = 1024,
        tenant_queue_limit: int | None = None,
        max_wait_s: float = 5.0,
    ) -> None:
        self.options = limits
        self.queue_limit = queue_limit
        # By default one tenant may hold three quarters of the line: a burst from one
        # caller leaves room for the others to queue at all.
        self.tenant_queue_limit = tenant_queue_limit or max(1, queue_limit * 3 // 4)
        self.max_wait_s = max_wait_s
        self.limits: dict[str, AdaptiveLimit] = {}
        self.in_flight: defaultdict[str, int] = defaultdict(int)
        self._models: dict[str, _Model[T]] = {}
        self._full: set[str] = set()

    # -- pipelines ---------------------------------------------------------------------

    def limit(self, pipeline_id: str) -> AdaptiveLimit:
        found = self.limits.get(pipeline_id)
        if found is None:
            found = self.limits[pipeline_id] = AdaptiveLimit(self.options)
        return found

    def full(self) -> AbstractSet[str]:
        """Pipelines carrying as many requests as their limit allows. Kept up to date as
        counts and limits change, not worked out per request: it is asked on every one."""
        return self._full

    def _check(self, pipeline_id: str) -> None:
        if self.in_flight[pipeline_id] >= self.limit(pipeline_id).capacity:
            self._full.add(pipeline_id)
        else:
            self._full.discard(pipeline_id)

    def _add(self, pipeline_id: str, delta: int) -> None:
        self.in_flight[pipeline_id] = max(0, self.in_flight[pipeline_id] + delta)
        self._check(pipeline_id)

    def began(self, pipeline_id: str) -> None:
        self._add(pipeline_id, 1)

    def ended(self, pipeline_id: str, model_id: str, now: float) -> None:
        self._add(pipeline_id, -1)
        self._model(model_id).finishing.finished(now)

    def moved(self, old: str, new: str) -> None:
        """A flight failed over from pipeline ``old`` to ``new``: its load moves too.
        (A rescue is never held back by the limit: the request was admitted already.)"""
        if old != new:
            self._add(old, -1)
            self._add(new, 1)

    def sample(self, pipeline_id: str, rtt_s: float, now: float) -> None:
        """One step along ``pipeline_id`` took ``rtt_s``."""
        self.limit(pipeline_id).sample(rtt_s, self.in_flight[pipeline_id], now)
        self._check(pipeline_id)

    # -- the line ----------------------------------------------------------------------

    def _model(self, model_id: str) -> _Model[T]:
        found = self._models.get(model_id)
        if found is None:
            found = self._models[model_id] = _Model(
                FairQueue(self.queue_limit, self.tenant_queue_limit)
            )
        return found

    def wait(self, model_id: str, tenant: str, item: T, now: float) -> bool:
        """Put ``item`` in the model's line; False when the line (or the tenant's share
        of it) is full."""
        return self._model(model_id).queue.push(tenant, item, now)

    def waiting(self, model_id: str) -> int:
        found = self._models.get(model_id)
        return len(found.queue) if found else 0

    def next(self, model_id: str) -> T | None:
        found = self._models.get(model_id)
        return found.queue.pop() if found else None

    def models_waiting(self) -> list[str]:
        return [m for m, found in self._models.items() if found.queue]

    def expired(self, now: float) -> Iterator[tuple[str, T]]:
        for model_id, found in self._models.items():
            for item in found.queue.expire(now, self.max_wait_s):
                yield model_id, item

    def drain(self) -> Iterator[T]:
        """Everything still waiting, taken out (the router is stopping)."""
        for found in self._models.values():
            while (item := found.queue.pop()) is not None:
                yield item

    def retry_after_s(self, model_id: str, now: float) -> float:
        """When a caller refused now should come back: the line ahead of it, at the rate
        this model's requests are finishing here."""
        found = self._model(model_id)
        return retry_after_s(len(found.queue), found.finishing.at(now))

    def status(self) -> dict[str, object]:
        return {
            "limits": {p: round(lim.limit, 2) for p, lim in sorted(self.limits.items())},
            "in_flight": {p: n for p, n in sorted(self.in_flight.items()) if n},
            "waiting": {m: len(f.queue) for m, f in sorted(self._models.items()) if f.queue},
        }
