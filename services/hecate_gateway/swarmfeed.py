"""What happened lately, for an operator's page: the event feed (recent failovers, plan
changes, nodes and circuits changing state, a burst folded into one line), the running
tallies and a tokens/s window. Pure: the clock is passed in. What the swarm looks like
right now is :mod:`hecate_gateway.swarmreport`.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Literal

import msgspec

from hecate_gateway.swarmreport import Circuit

FeedKind = Literal["failover", "plan", "node", "breaker", "service"]


class FeedEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the feed. ``id`` names the line for good; ``rev`` grows each time the
    line changes (a burst of like events folds into one line, ``count`` of them)."""

    id: int
    rev: int
    at: float
    kind: FeedKind
    tag: str  # the failover's kind, the node's or circuit's new state, the planner strategy
    text: str
    node_id: str | None = None
    model_id: str | None = None
    count: int = 1


class Feed:
    """The last ``size`` events, newest first. An event like the newest one (same kind,
    tag, node and model) within ``fold_s`` of it folds into its line: one node killed
    under load fails over every request it held, and the feed should say so once."""

    def __init__(self, size: int = 200, fold_s: float = 5.0) -> None:
        self.entries: deque[FeedEntry] = deque(maxlen=size)
        self.fold_s = fold_s
        self.rev = 0
        self._ids = 0

    def add(
        self,
        kind: FeedKind,
        tag: str,
        text: str,
        at: float,
        *,
        node_id: str | None = None,
        model_id: str | None = None,
    ) -> FeedEntry:
        self.rev += 1
        top = self.entries[0] if self.entries else None
        if (
            top is not None
            and (top.kind, top.tag, top.node_id, top.model_id) == (kind, tag, node_id, model_id)
            and abs(at - top.at) <= self.fold_s
        ):
            entry = msgspec.structs.replace(
                top, rev=self.rev, at=max(at, top.at), text=text, count=top.count + 1
            )
            self.entries[0] = entry
            return entry
        self._ids += 1
        entry = FeedEntry(
            id=self._ids,
            rev=self.rev,
            at=at,
            kind=kind,
            tag=tag,
            text=text,
            node_id=node_id,
            model_id=model_id,
        )
        self.entries.appendleft(entry)
        return entry

    def newest_first(self) -> list[FeedEntry]:
        return list(self.entries)

    def since(self, rev: int) -> list[FeedEntry]:
        """Lines added or changed after ``rev``, oldest change first (the order to apply
        them in)."""
        return sorted((e for e in self.entries if e.rev > rev), key=lambda e: e.rev)


class Tally:
    """Counts of what the events said, for Prometheus counters: failovers by kind and
    circuit trips (closed -> open; a failed probe re-opening a half-open circuit is not
    a trip). A circuit first heard of as open counts as a trip: it opened from closed
    or from a probe, and the first is far more common. And when the planner last spoke
    (``plan_heard``, its clock): a notice repeated adds no feed line, only this."""

    def __init__(self) -> None:
        self.failovers: Counter[str] = Counter()
        self.breaker_trips = 0
        self.plan_heard: float | None = None
        self._circuits: dict[str, Circuit] = {}

    def failover(self, kind: str) -> None:
        self.failovers[kind] += 1

    def breaker(self, target: str, state: Circuit) -> bool:
        """Returns whether this change is a trip."""
        before = self._circuits.get(target, "closed")
        self._circuits[target] = state
        trip = state == "open" and before == "closed"
        self.breaker_trips += trip
        return trip


class TokenRate:
    """Tokens per second over the last ``window_s`` seconds (a sliding window; the
    clock is the caller's, the same one for counting and asking)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._counts: deque[tuple[float, int]] = deque()
        self._sum = 0

    def add(self, n: int, now: float) -> None:
        if n <= 0:
            return
        # Counts within a tenth of a second share a slot: a streamed token per call
        # must not grow the window to one entry per token.
        if self._counts and now - self._counts[-1][0] < 0.1:
            at, held = self._counts[-1]
            self._counts[-1] = (at, held + n)
        else:
            self._counts.append((now, n))
        self._sum += n
        self._expire(now)

    def rate(self, now: float) -> float:
        self._expire(now)
        return self._sum / self.window_s

    def _expire(self, now: float) -> None:
        while self._counts and self._counts[0][0] <= now - self.window_s:
            self._sum -= self._counts.popleft()[1]
