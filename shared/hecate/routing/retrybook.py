"""What a router knows of its callers' retries, pure: which requests it runs, which it
answered (and what), and which retries wait to hear whether another replica owns them.

A client retries with the same ``(tenant, request_id)``; a retry must never run the
request twice. On the replica that has it, a retry joins the running request or gets
the remembered answer again. A retry (``attempt > 1``) that lands on another replica
is *claimed* first: that replica asks every router, and runs it only if no owner
answers within ``claim_s``. The router shell (services/retries.py) does the asking.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

Ident = tuple[str, str]  # (tenant, request_id)
Answer = tuple[bytes, dict[str, str] | None]  # the encoded reply and its headers
H = TypeVar("H")  # what the shell holds for a retry awaiting its claim


@dataclass(frozen=True, slots=True)
class Running:
    key: int  # the flight


@dataclass(frozen=True, slots=True)
class Answered:
    answer: Answer


class RetryBook(Generic[H]):
    def __init__(self, *, remember: int = 10_000, claim_s: float = 0.05) -> None:
        self.remember = remember
        self.claim_s = claim_s
        self.in_progress: dict[Ident, int] = {}
        self.answered: OrderedDict[Ident, Answer] = OrderedDict()
        self.pending: dict[int, tuple[H, float]] = {}  # claim number -> (retry, deadline)
        self._claims = 0

    def started(self, ident: Ident, key: int) -> None:
        self.in_progress[ident] = key

    def finished(self, ident: Ident, answer: Answer) -> None:
        """Answered: remembered (the newest ``remember``) for retries still to come."""
        self.in_progress.pop(ident, None)
        self.answered[ident] = answer
        self.answered.move_to_end(ident)
        while len(self.answered) > self.remember:
            self.answered.popitem(last=False)

    def lookup(self, ident: Ident) -> Running | Answered | None:
        key = self.in_progress.get(ident)
        if key is not None:
            return Running(key)
        answer = self.answered.get(ident)
        return Answered(answer) if answer is not None else None

    def claim(self, retry: H, now: float) -> int:
        """A retry of a request this replica never saw: a number to ask the others by."""
        self._claims += 1
        self.pending[self._claims] = (retry, now + self.claim_s)
        return self._claims

    def owned(self, n: int) -> H | None:
        """Another replica owns claim ``n`` and answered the client itself."""
        held = self.pending.pop(n, None)
        return held[0] if held is not None else None

    def unclaimed(self, now: float) -> list[H]:
        """Retries nobody owned in time: their original is gone; run them here."""
        due = [n for n, (_, deadline) in self.pending.items() if now >= deadline]
        return [self.pending.pop(n)[0] for n in due]
