"""Breaker reports that could not be delivered yet, for a later try. No I/O here.

Two places keep them: a router that cannot reach a breaker service (disconnected, or
just reconnected) and the breaker service when the bucket cannot take them. Both want
the same thing: oldest first, at most ``max_len`` (the oldest make room), and none kept
longer than ``max_age_s``, since a failure held past the breaker's window would be
counted as a fresh one when it finally lands. Whatever leaves without being delivered
is returned, so the caller counts and logs every report it drops. The caller passes
``now`` on its own clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import msgspec

from hecate.wire.messages import OutcomeReport


class Held(msgspec.Struct, frozen=True):
    report: OutcomeReport
    received: float  # when it was kept, on the keeper's clock


class Backlog:
    def __init__(self, max_age_s: float, max_len: int) -> None:
        self.max_age_s = max_age_s
        self.max_len = max_len
        self._held: deque[Held] = deque()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, report: OutcomeReport, now: float) -> list[Held]:
        """Keep ``report``; the reports pushed out to make room (oldest first)."""
        self._held.append(Held(report, now))
        return self._make_room()

    def put_back(self, held: Iterable[Held]) -> list[Held]:
        """Reports taken out but not delivered go back in front, in their order (they
        keep their age); the reports pushed out to make room."""
        self._held.extendleft(reversed(list(held)))
        return self._make_room()

    def expired(self, now: float) -> list[Held]:
        """Take out the reports held longer than ``max_age_s``."""
        out: list[Held] = []
        while self._held and now - self._held[0].received > self.max_age_s:
            out.append(self._held.popleft())
        return out

    def take(self) -> list[Held]:
        """Everything held, to deliver at once."""
        out = list(self._held)
        self._held.clear()
        return out

    def first(self) -> Held | None:
        return self._held[0] if self._held else None

    def pop(self) -> None:
        self._held.popleft()

    def _make_room(self) -> list[Held]:
        out: list[Held] = []
        while len(self._held) > self.max_len:
            out.append(self._held.popleft())
        return out
