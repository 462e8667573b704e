"""Keeping a swarm's services running: one that exits is started again, after a pause
that doubles with each exit in a row (``first_s``, twice that, ... at most ``most_s``)
and starts over once it has stayed up ``settled_s``. A service that fails at once, every
time (a port taken, a bad flag), is retried ever more slowly, never in a tight loop.

No I/O and no clock of its own: :class:`Keeper` is told when each service started and
exited, and says which are due to start again; ``hecate up`` polls its processes, carries
that out, and tells the operator and the bus (:mod:`hecate_launcher.keeping`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Exit", "Keeper"]


@dataclass(frozen=True, slots=True)
class Exit:
    """What the keeper makes of ``label``'s exit: its ``restarts`` so far (this one
    included), and the pause before it starts again, at ``due``."""

    label: str
    code: int
    restarts: int
    delay_s: float
    due: float


@dataclass
class Keeper:
    first_s: float = 1.0
    most_s: float = 30.0
    settled_s: float = 60.0
    restarts: Counter[str] = field(default_factory=Counter)  # per label, since launch
    _started: dict[str, float] = field(default_factory=dict)
    _streak: Counter[str] = field(default_factory=Counter)  # exits in a row
    _waiting: dict[str, Exit] = field(default_factory=dict)

    def started(self, label: str, now: float) -> None:
        self._started[label] = now
        self._waiting.pop(label, None)

    def waiting(self, label: str) -> bool:
        """Whether ``label`` has exited and waits to start again."""
        return label in self._waiting

    def exited(self, label: str, code: int, now: float) -> Exit:
        """``label`` exited with ``code``: when it starts again."""
        up_s = now - self._started.get(label, now)
        if up_s >= self.settled_s:
            self._streak[label] = 0  # it ran a while: this exit starts a new streak
        delay = min(self.most_s, self.first_s * 2 ** self._streak[label])
        self._streak[label] += 1
        self.restarts[label] += 1
        ex = Exit(label, code, self.restarts[label], delay, now + delay)
        self._waiting[label] = ex
        return ex

    def due(self, now: float) -> list[Exit]:
        """The exits whose pause is over, oldest first; each is forgotten as given."""
        ready = sorted((e for e in self._waiting.values() if e.due <= now), key=lambda e: e.due)
        for e in ready:
            del self._waiting[e.label]
        return ready
