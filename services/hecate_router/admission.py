"""The router's admission desk: requests in flight per pipeline, and the line for room.

No I/O here; the router feeds it and carries out what it says. Per pipeline, :mod:`.limits`'s
:class:`AdaptiveLimit` says how many requests it may carry (learned from that
pipeline's own step times) and the desk counts how many it carries now; per model, a
:class:`FairQueue` holds the requests that found every healthy pipeline full, in turn
per tenant, until a flight lands and makes room, or until their wait is over: what the
line ahead of them needs at the rate this model's requests finish (:func:`line_wait_s`:
at least ``max_wait_s``, at most ``max_line_wait_s``). Then they are refused as
``rate_limited``, with a Retry-After worked out the same way and a line ticket: a caller
that comes back with it within its Retry-After (and a grace) takes its old place in
line, ahead of whoever came after it.

This router's own flights are what it counts: replicas of the router each keep their
own desk, and since every replica measures the same pipelines' step times, their limits
agree without talking to each other. (A line ticket is this replica's: one presented to
another is a stranger's, and queues as new.)
"""

from __future__ import annotations

import secrets
from collections import OrderedDict, defaultdict
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from hecate_router.limits import (
    DEFAULT_LIMIT,
    AdaptiveLimit,
    FairQueue,
    Finishing,
    LimitOptions,
    line_wait_s,
    retry_after_s,
)

# How long past its Retry-After a line ticket still holds its place.
TICKET_GRACE_S = 5.0
# Line tickets kept at most (the oldest go first): more than a full line's worth.
MAX_TICKETS = 8192


def is_line_ticket(ticket: int | None) -> bool:
    """Line tickets are negative; the quota desk's count up from 1: the one field
    carries either, and each desk knows its own."""
    return ticket is not None and ticket < 0


@dataclass(frozen=True, slots=True)
class _Ticket:
    model_id: str
    tenant: str
    since: float  # the place it holds
    until: float  # it holds it until then


T = TypeVar("T")


@dataclass(slots=True)
class _Model(Generic[T]):
    queue: FairQueue[T]
    finishing: Finishing = field(default_factory=Finishing)


class AdmissionDesk(Generic[T]):
    def __init__(
        self,
        *,
        limits: LimitOptions = DEFAULT_LIMIT,
        queue_limit: int = 1024,
        tenant_queue_limit: int | None = None,
        max_wait_s: float = 5.0,
        max_line_wait_s: float = 60.0,
    ) -> None:
        """``max_wait_s``: the least a request may wait in line (and its wait while no
        request has finished yet); ``max_line_wait_s``: the most, whatever the line."""
        if not 0 < max_wait_s <= max_line_wait_s:
            raise ValueError("need 0 < max_wait_s <= max_line_wait_s")
        self.options = limits
        self.queue_limit = queue_limit
        # By default one tenant may hold three quarters of the line: a burst from one
        # caller leaves room for the others to queue at all.
        self.tenant_queue_limit = tenant_queue_limit or max(1, queue_limit * 3 // 4)
        self.max_wait_s = max_wait_s
        self.max_line_wait_s = max_line_wait_s
        self._tickets: OrderedDict[int, _Ticket] = OrderedDict()
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

    def began(self, pipeline_id: str, model_id: str) -> None:
        self._add(pipeline_id, 1)
        self._model(model_id).finishing.began()

    def ended(self, pipeline_id: str, model_id: str, took_s: float) -> None:
        """A flight of ``model_id`` on ``pipeline_id`` landed, ``took_s`` after it began."""
        self._add(pipeline_id, -1)
        self._model(model_id).finishing.finished(took_s)

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

    def wait(
        self, model_id: str, tenant: str, item: T, now: float, *, ticket: int | None = None
    ) -> bool:
        """Put ``item`` in the model's line, for as long as the line ahead needs; at the
        place its line ``ticket`` holds, if it presents a good one of this tenant's.
        False when the line (or the tenant's share of it) is full."""
        found = self._model(model_id)
        wait = line_wait_s(
            len(found.queue),
            found.finishing.per_s(),
            least_s=self.max_wait_s,
            most_s=self.max_line_wait_s,
        )
        since = self.place(ticket, model_id, tenant, now)
        return found.queue.push(tenant, item, now, until=now + wait, since=since)

    def ticket(
        self, model_id: str, tenant: str, since: float, retry_after_s: float, now: float
    ) -> int:
        """A line ticket for a caller refused now that first asked at ``since``: its
        place, held until its Retry-After and :data:`TICKET_GRACE_S` have passed."""
        self._forget(now)
        while len(self._tickets) >= MAX_TICKETS:
            self._tickets.popitem(last=False)
        number = -1 - secrets.randbits(52)
        until = now + retry_after_s + TICKET_GRACE_S
        self._tickets[number] = _Ticket(model_id, tenant, since, until)
        return number

    def place(self, ticket: int | None, model_id: str, tenant: str, now: float) -> float | None:
        """The place a line ticket holds (when its caller first asked), spent by asking;
        None for no ticket, a stale one, or another tenant's or model's."""
        self._forget(now)
        if not is_line_ticket(ticket):
            return None
        assert ticket is not None
        held = self._tickets.get(ticket)
        if held is None or held.tenant != tenant or held.model_id != model_id:
            return None
        del self._tickets[ticket]
        return held.since

    def _forget(self, now: float) -> None:
        """Drop tickets past their time, oldest first (they are kept in the order they
        were given, which is nearly the order they end)."""
        while self._tickets:
            number, held = next(iter(self._tickets.items()))
            if held.until >= now:
                return
            del self._tickets[number]

    def waiting(self, model_id: str) -> int:
        found = self._models.get(model_id)
        return len(found.queue) if found else 0

    def next(self, model_id: str) -> T | None:
        found = self._models.get(model_id)
        return found.queue.pop() if found else None

    def models_waiting(self) -> list[str]:
        return [m for m, found in self._models.items() if found.queue]

    def expired(self, now: float) -> Iterator[tuple[str, T, float]]:
        """Requests whose wait is over: model, request, and its place (when it asked)."""
        for model_id, found in self._models.items():
            for item, since in found.queue.expire(now):
                yield model_id, item, since

    def drain(self) -> Iterator[T]:
        """Everything still waiting, taken out (the router is stopping)."""
        for found in self._models.values():
            while (item := found.queue.pop()) is not None:
                yield item

    def retry_after_s(self, model_id: str) -> float:
        """When a caller refused now should come back: the line ahead of it, at the rate
        this model's requests are finishing here."""
        found = self._model(model_id)
        return retry_after_s(len(found.queue), found.finishing.per_s())

    def status(self) -> dict[str, object]:
        return {
            "limits": {p: round(lim.limit, 2) for p, lim in sorted(self.limits.items())},
            "in_flight": {p: n for p, n in sorted(self.in_flight.items()) if n},
            "waiting": {m: len(f.queue) for m, f in sorted(self._models.items()) if f.queue},
        }
