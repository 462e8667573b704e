"""Admission control: how many requests a pipeline takes at once, and who waits next.

A swarm pushed past what it can compute must answer later, or say "not now"
(``rate_limited`` with a Retry-After it can stand by), never break: work piled onto
busy nodes only makes every step slower, until stage deadlines pass, failure detection
fires on nodes that are merely busy, and live copies are failed over onto each other.

Two pieces, both pure (the clock is passed in):

* :class:`AdaptiveLimit`, one per pipeline: the number of requests it may carry, found
  from its own measurements by Little's law. Carried at its limit ``L``, a pipeline
  serves ``L / rtt`` steps a second; the limit that keeps a step within the target
  latency is that throughput times the target, ``L · target / rtt``. The target is a
  tolerance over the best step time seen (``min_rtt``, re-learned from quiet steps so it
  follows a swarm that changed), never tighter than ``min_rtt + slack_s``: a sub-
  millisecond toy stage would otherwise be "overloaded" by scheduling noise. Above the
  target the limit falls in proportion; below it, and only while the limit is what
  holds traffic back, it grows by ``sqrt(limit)`` (room to find out whether more
  work still raises throughput, as batched decoding does). Smoothed, floored, capped.
* :class:`FairQueue`, one per model: requests waiting for room, one FIFO per tenant,
  served round-robin across tenants, bounded in total and per tenant, so one tenant's
  burst cannot push the others out of line or out of the queue.

And :func:`retry_after_s`: how long a refused caller should stand off, from the queue
ahead of it and the rate at which requests are finishing, as measured.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LimitOptions:
    initial: float = 1.0  # its first steps are then uncontended: the best time is learned
    floor: float = 1.0
    ceiling: float = 64.0
    tolerance: float = 2.0  # a step may take this many times the best one seen
    slack_s: float = 0.05  # ... and always at least this much more than it
    smoothing: float = 0.2  # weight of each new estimate
    window_s: float = 60.0  # min_rtt is re-learned over two such windows

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.initial <= self.ceiling:
            raise ValueError("need 1 <= floor <= initial <= ceiling")
        if self.tolerance < 1 or self.slack_s < 0 or not 0 < self.smoothing <= 1:
            raise ValueError("need tolerance >= 1, slack_s >= 0, 0 < smoothing <= 1")
        if self.window_s <= 0:
            raise ValueError("need window_s > 0")


DEFAULT_LIMIT = LimitOptions()


@dataclass(slots=True)
class AdaptiveLimit:
    """How many requests one pipeline may carry; fed one sample per measured step."""

    options: LimitOptions = DEFAULT_LIMIT
    limit: float = field(init=False)
    rtt_s: float | None = field(default=None, init=False)  # smoothed recent step time
    _mins: tuple[float, float] = field(default=(math.inf, math.inf), init=False)
    _window: float | None = field(default=None, init=False)  # start of the current window

    def __post_init__(self) -> None:
        self.limit = self.options.initial

    @property
    def capacity(self) -> int:
        """Requests admitted at once: the limit, rounded down, never below the floor."""
        return max(int(self.options.floor), int(self.limit))

    @property
    def min_rtt_s(self) -> float | None:
        best = min(self._mins)
        return None if math.isinf(best) else best

    def target_s(self) -> float | None:
        best = self.min_rtt_s
        if best is None:
            return None
        return max(best * self.options.tolerance, best + self.options.slack_s)

    def sample(self, rtt_s: float, in_flight: int, now: float) -> None:
        """One step of this pipeline took ``rtt_s`` while it carried ``in_flight``
        requests (this one included)."""
        if not math.isfinite(rtt_s) or rtt_s <= 0:
            return
        o = self.options
        if self._window is None or now - self._window >= o.window_s:
            # A new window. The best time is re-learned only from steps taken with the
            # pipeline (nearly) idle, since a step under load is slower by the load
            # itself, and "re-learning" from those would let the target climb with the
            # load it should hold back. A window without such a step keeps the best
            # time it had, so nothing is forgotten all at once; a swarm that really got
            # slower (a node replaced by a slower one) is re-learned within two windows
            # of quiet steps.
            previous, current = self._mins
            self._mins = (current if math.isfinite(current) else previous, math.inf)
            self._window = now
        if in_flight <= 1 or rtt_s < self._mins[0]:
            self._mins = (self._mins[0], min(self._mins[1], rtt_s))
        self.rtt_s = (
            rtt_s if self.rtt_s is None else self.rtt_s + o.smoothing * (rtt_s - self.rtt_s)
        )
        target = self.target_s()
        assert target is not None
        estimate = self.limit * min(1.0, target / self.rtt_s)
        if self.rtt_s <= target and in_flight >= self.capacity:
            estimate += math.sqrt(self.limit)  # the limit holds traffic back: probe above it
        self.limit = min(
            o.ceiling, max(o.floor, self.limit + o.smoothing * (estimate - self.limit))
        )


@dataclass(slots=True)
class _Waiting(Generic[T]):
    item: T
    since: float


class FairQueue(Generic[T]):
    """Waiting requests: a FIFO per tenant, tenants served in turn.

    ``push`` refuses (returns False) when the queue holds ``limit`` items, or the tenant
    already holds ``tenant_limit`` of them; ``pop`` takes the oldest item of the next
    tenant in rotation, so a tenant with one request waiting is served after at most one
    request of every other tenant, however many those have queued."""

    def __init__(self, limit: int = 64, tenant_limit: int | None = None) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self.tenant_limit = max(1, min(limit, tenant_limit or limit))
        self._tenants: dict[str, deque[_Waiting[T]]] = {}  # insertion order = rotation
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def waiting(self, tenant: str) -> int:
        return len(self._tenants.get(tenant, ()))

    def push(self, tenant: str, item: T, now: float) -> bool:
        if self._size >= self.limit or self.waiting(tenant) >= self.tenant_limit:
            return False
        self._tenants.setdefault(tenant, deque()).append(_Waiting(item, now))
        self._size += 1
        return True

    def pop(self) -> T | None:
        for tenant in self._tenants:
            line = self._tenants.pop(tenant)
            waiting = line.popleft()
            if line:
                self._tenants[tenant] = line  # to the back of the rotation
            self._size -= 1
            return waiting.item
        return None

    def expire(self, now: float, max_wait_s: float) -> list[T]:
        """Take out every item that has waited longer than ``max_wait_s``."""
        return self.remove(lambda _item, since: now - since > max_wait_s)

    def remove(self, drop: Callable[[T, float], bool]) -> list[T]:
        """Take out the items ``drop(item, since)`` selects, keeping everyone's order."""
        out: list[T] = []
        for tenant, line in list(self._tenants.items()):
            kept = deque(w for w in line if not drop(w.item, w.since))
            if len(kept) == len(line):
                continue
            out.extend(w.item for w in line if drop(w.item, w.since))
            if kept:
                self._tenants[tenant] = kept
            else:
                del self._tenants[tenant]
        self._size -= len(out)
        return out

    def __iter__(self) -> Iterator[T]:
        for line in self._tenants.values():
            for w in line:
                yield w.item


@dataclass(slots=True)
class Throughput:
    """Requests finished per second: each adds ``1 / tau_s`` to a sum that decays with
    time constant ``tau_s``, which at a steady rate equals that rate."""

    tau_s: float = 5.0
    _sum: float = 0.0
    _last: float | None = None

    def finished(self, now: float, count: int = 1) -> None:
        self._sum = self.at(now) + count / self.tau_s
        self._last = now

    def at(self, now: float) -> float:
        if self._last is None:
            return 0.0
        return self._sum * math.exp(-max(0.0, now - self._last) / self.tau_s)


def retry_after_s(ahead: int, finishing_per_s: float, *, floor_s: float = 1.0) -> float:
    """When a refused caller should come back: the time the ``ahead`` requests before
    it take to finish at the measured rate, never less than ``floor_s`` (and that floor
    when nothing has been measured yet)."""
    if finishing_per_s <= 0:
        return floor_s
    return max(floor_s, (ahead + 1) / finishing_per_s)
