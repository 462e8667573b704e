"""Admission control: how many requests a pipeline takes at once, and who waits next.

A swarm pushed past what it can compute must answer later, or say "not now"
(``rate_limited`` with a Retry-After it can stand by), never break: work piled onto
busy nodes only makes every step slower, until stage deadlines pass, failure detection
fires on nodes that are merely busy, and live copies are failed over onto each other.

Two pieces, both pure (the clock is passed in):

* :class:`AdaptiveLimit`, one per pipeline: the number of requests it may carry, found
  from its own measurements: twice the most it was seen to carry while its steps kept
  a good pace (within three times its best step). A pipeline with room lets the limit
  double step after step; one whose steps slow down past that pace stops it there.
* :class:`FairQueue`, one per model: requests waiting for room, one FIFO per tenant,
  served round-robin across tenants, bounded in total and per tenant, so one tenant's
  burst cannot push the others out of line or out of the queue.

And, from the line ahead and the rate requests finish at (:class:`Finishing`, by
Little's law), :func:`line_wait_s`: how long a request may wait in line, and
:func:`retry_after_s`: how long a refused caller should stand off.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LimitOptions:
    initial: float = 4.0
    floor: float = 1.0
    ceiling: float = 64.0
    gain: float = 2.0  # the limit, as a multiple of the most carried at a good pace
    tolerance: float = 3.0  # a good pace: steps within this many times the best one
    slack_s: float = 0.05  # the best step time is taken as at least this
    held_window_s: float = 10.0  # the most carried is remembered over two such windows
    rtt_window_s: float = 60.0  # the best step time: over two such windows of quiet steps

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.initial <= self.ceiling:
            raise ValueError("need 1 <= floor <= initial <= ceiling")
        if self.gain < 1 or self.tolerance < 1 or self.slack_s < 0:
            raise ValueError("need gain >= 1, tolerance >= 1 and slack_s >= 0")
        if self.held_window_s <= 0 or self.rtt_window_s <= 0:
            raise ValueError("need windows > 0")


DEFAULT_LIMIT = LimitOptions()


@dataclass(slots=True)
class _Windowed:
    """The best (least or greatest) value over the current window and the one before:
    a good value is never forgotten all at once, and stale ones age out in two windows.

    Windows start with the samples: time with no sample at all passes no window, so an
    idle pipeline forgets nothing by being idle. A window that took no value leaves
    nothing behind it, so two windows of samples that say nothing empty it."""

    window_s: float
    least: bool
    values: tuple[float, float] = (math.nan, math.nan)  # (previous window, current)
    started: float | None = None

    def best(self) -> float | None:
        known = [v for v in self.values if not math.isnan(v)]
        if not known:
            return None
        return min(known) if self.least else max(known)

    def add(self, value: float | None, now: float) -> None:
        """Start a new window when due; then take ``value`` into this one (``None``: a
        sample that says nothing about it)."""
        if self.started is None or now - self.started >= self.window_s:
            self.values = (self.values[1], math.nan)
            self.started = now
        if value is not None:
            current = self.values[1]
            if math.isnan(current):
                current = value
            else:
                current = min(current, value) if self.least else max(current, value)
            self.values = (self.values[0], current)


@dataclass(slots=True)
class AdaptiveLimit:
    """How many requests one pipeline may carry; fed one sample per measured step.

    The most requests the pipeline was seen to carry while its steps kept a good pace
    (within ``tolerance`` times the best step, itself never taken as less than
    ``slack_s``), remembered over a window, times ``gain``. A pipeline with room lets the
    limit double step after step (it carries ``L`` at a good pace, so ``gain · L`` is
    allowed next); one whose steps slow down past the pace stops it there: batched
    decoding serves more sessions at once at a modest cost per step, up to the point the
    limit finds. (By Little's law, requests carried at a pace is throughput times step
    time: the limit is sized from what the pipeline measurably serves.)

    A step past the pace counts too, for what it says the pipeline serves now: carrying
    ``n`` in ``rtt``, it would carry ``n · pace / rtt`` at the good pace (Little's law
    again), and never more than the figure it has. Where the limit only overshoots (steps
    at ``gain · L`` a little past the pace), that is about ``L`` again and the limit holds.
    When the pipeline slows down for good (someone else's work on its cores), every step
    says less, the good-pace figures age out within two windows, and the limit falls,
    window after window, toward what the pipeline now serves.

    The best step time is only learned from steps taken with the pipeline (nearly) idle:
    a step under load is slower by the load itself, and learning from one would let the
    limit ratchet up on its own overshoot. While the pipeline stays loaded the last best
    figure stands; a falling limit drains the pipeline, and its near-idle steps then
    re-learn the best time at the new pace (once two windows have passed without one,
    the first such step replaces the old figure outright, as nothing confirmed it). The
    steps at the new pace keep a good pace again, and the limit climbs back to what the
    pipeline carries at it. A pipeline with no steps at all forgets nothing: its windows
    only move with its samples."""

    options: LimitOptions = DEFAULT_LIMIT
    limit: float = field(init=False)
    _rtt: _Windowed = field(init=False)
    _held: _Windowed = field(init=False)
    _last_rtt: float | None = field(init=False, default=None)  # once _rtt has aged out

    def __post_init__(self) -> None:
        self.limit = self.options.initial
        self._rtt = _Windowed(self.options.rtt_window_s, least=True)
        self._held = _Windowed(self.options.held_window_s, least=False)

    @property
    def capacity(self) -> int:
        """Requests admitted at once: the limit, rounded down, never below the floor."""
        return max(int(self.options.floor), int(self.limit))

    @property
    def min_rtt_s(self) -> float | None:
        """The best step time over the last two windows of near-idle steps; while the
        pipeline has been loaded longer than that, the last such figure."""
        best = self._rtt.best()
        return self._last_rtt if best is None else best

    @property
    def held(self) -> float | None:
        """The most requests carried at a good pace lately (from steps past the pace:
        what they say the pipeline would carry at it)."""
        return self._held.best()

    def sample(self, rtt_s: float, in_flight: int, now: float) -> None:
        """One step of this pipeline took ``rtt_s`` while it carried ``in_flight``
        requests (this one included)."""
        if not math.isfinite(rtt_s) or rtt_s <= 0:
            return
        o = self.options
        # The best step time is re-learned only from steps taken with the pipeline
        # (nearly) idle: a step under load is slower by the load itself. A faster step
        # always counts.
        before = self.min_rtt_s
        counts = in_flight <= 1 or before is None or rtt_s < before
        self._rtt.add(rtt_s if counts else None, now)
        best = self.min_rtt_s
        assert best is not None
        self._last_rtt = best
        pace = o.tolerance * max(best, o.slack_s)
        carried = float(max(1, in_flight))
        if rtt_s <= pace:
            self._held.add(carried, now)
        else:
            # What it serves now, carried at the good pace; capped so that a step past
            # the pace never raises the limit.
            serves = carried * pace / rtt_s
            held = self._held.best()
            self._held.add(serves if held is None else min(held, serves), now)
        held = self._held.best()
        assert held is not None  # every step leaves a value in the current window
        self.limit = min(o.ceiling, max(o.floor, o.gain * held))


@dataclass(slots=True)
class _Waiting(Generic[T]):
    item: T
    since: float  # its place: when it first asked (a refused caller back keeps it)
    until: float  # when it stops waiting and is refused


class FairQueue(Generic[T]):
    """Waiting requests: a line per tenant in order of arrival, tenants served in turn.

    ``push`` refuses (returns False) when the queue holds ``limit`` items, or the tenant
    already holds ``tenant_limit`` of them; ``pop`` takes the earliest item of the next
    tenant in rotation, so a tenant with one request waiting is served after at most one
    request of every other tenant, however many those have queued. An item pushed with
    an earlier ``since`` than others of its tenant (a refused caller come back as told)
    goes before them: its place is when it first asked."""

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

    def push(
        self,
        tenant: str,
        item: T,
        now: float,
        *,
        until: float = math.inf,
        since: float | None = None,
    ) -> bool:
        """Wait until ``until`` at most; ``since``: its place, when not ``now``."""
        if self._size >= self.limit or self.waiting(tenant) >= self.tenant_limit:
            return False
        line = self._tenants.setdefault(tenant, deque())
        if since is None:
            line.append(_Waiting(item, now, until))
        else:  # back with its place: before those of its tenant who came after it
            at = len(line)
            while at > 0 and line[at - 1].since > since:
                at -= 1
            line.insert(at, _Waiting(item, min(since, now), until))
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

    def expire(self, now: float) -> list[tuple[T, float]]:
        """Take out every item whose wait is over, with its place (``since``). Only each
        tenant's head is looked at: an item whose wait ends before the one ahead of it
        (both are served in turn anyway) waits for that one to be served or to go."""
        out: list[tuple[T, float]] = []
        for tenant, line in list(self._tenants.items()):
            while line and now > line[0].until:
                gone = line.popleft()
                out.append((gone.item, gone.since))
            if not line:
                del self._tenants[tenant]
        self._size -= len(out)
        return out

    def __iter__(self) -> Iterator[T]:
        for line in self._tenants.values():
            for w in line:
                yield w.item


@dataclass(slots=True)
class Finishing:
    """How fast a model's requests finish, by Little's law: the requests carried at once
    over how long one takes (a moving average of those that finished).

    Counting finishes per second over a recent window instead reads near zero while
    long generations are all still running (none finished lately), and a caller told
    to wait for the line ahead at that rate was told minutes for a line of seconds;
    what is carried now, and how long each takes, says what the line will do."""

    weight: float = 0.2  # of the latest finish in the average
    took_s: float | None = None  # how long a request takes here, on average
    carried: int = 0  # requests carried now

    def began(self) -> None:
        self.carried += 1

    def finished(self, took_s: float) -> None:
        self.carried = max(0, self.carried - 1)
        if not math.isfinite(took_s) or took_s < 0:
            return
        if self.took_s is None:
            self.took_s = took_s
        else:
            self.took_s += self.weight * (took_s - self.took_s)

    def per_s(self) -> float:
        """Requests finishing per second; 0 while nothing is known (nothing finished
        yet, or nothing carried)."""
        if self.took_s is None or self.carried == 0:
            return 0.0
        return self.carried / max(self.took_s, 1e-3)


def retry_after_s(ahead: int, finishing_per_s: float, *, floor_s: float = 1.0) -> float:
    """When a refused caller should come back: the time the ``ahead`` requests before
    it take to finish at the measured rate, never less than ``floor_s`` (and that floor
    when nothing has been measured yet)."""
    if finishing_per_s <= 0:
        return floor_s
    return max(floor_s, (ahead + 1) / finishing_per_s)


def line_wait_s(
    ahead: int, finishing_per_s: float, *, least_s: float, most_s: float, margin: float = 1.5
) -> float:
    """How long a request joining the line behind ``ahead`` others may wait: what the
    line ahead needs at the measured rate, with ``margin`` for its spread, within
    ``least_s`` (also the wait while nothing is measured) and ``most_s``. A fixed wait
    refuses, every time, a request that would have been served a moment later."""
    if finishing_per_s <= 0:
        return least_s
    return min(most_s, max(least_s, margin * (ahead + 1) / finishing_per_s))
