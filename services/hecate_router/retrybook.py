"""What a router knows of its callers' retries, pure: which requests it runs, which it
answered (and what), and which retries wait to hear whether another replica owns them.

A client retries with the same ``(tenant, request_id)``; a retry must never run the
request twice. On the replica that has it, a retry joins the running request or gets
the remembered answer again. A retry (``attempt > 1``) that lands on another replica
is *claimed* first: that replica asks every router, and runs it only if no owner
answers within ``claim_s``. The router shell (retries.py) does the asking.

The newest answers are remembered, within ``remember`` of them and ``remember_bytes``
(bodies and headers): a 4,096-token reply is some 16 KB of text, so the count alone
let the book hold 160 MB and more. A retry of an answer forgotten, or never
kept because it alone is larger than the budget, is one of a request this replica has
no record of: claimed if it says it is a retry, and run again if nobody owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

Ident = tuple[str, str]  # (tenant, request_id)
Answer = tuple[bytes, dict[str, str] | None]  # the encoded reply and its headers
# NATS' largest max_payload (1 MiB by default): an answer the bus can carry always fits.
REMEMBER_BYTES = 64 * 1024 * 1024
# Retries of one running request held for its answer (the shell holds them): a client
# retrying on a short timeout reaches a few while a long generation runs.
MAX_JOINED = 8
H = TypeVar("H")  # what the shell holds for a retry awaiting its claim


@dataclass(frozen=True, slots=True)
class Running:
    key: int  # the flight


@dataclass(frozen=True, slots=True)
class Answered:
    answer: Answer


def weight(answer: Answer) -> int:
    """The bytes an answer holds: its encoded body and its headers."""
    body, headers = answer
    if not headers:
        return len(body)
    return len(body) + sum(len(k.encode()) + len(v.encode()) for k, v in headers.items())


class RetryBook(Generic[H]):
    def __init__(
        self,
        *,
        remember: int = 10_000,
        remember_bytes: int = REMEMBER_BYTES,
        claim_s: float = 0.05,
    ) -> None:
        self.remember = remember
        self.remember_bytes = remember_bytes
        self.claim_s = claim_s
        self.in_progress: dict[Ident, int] = {}
        self.answered: OrderedDict[Ident, Answer] = OrderedDict()
        self.bytes_held = 0  # the weight of ``answered``
        self.pending: dict[int, tuple[H, float]] = {}  # claim number -> (retry, deadline)
        self._claims = 0

    def started(self, ident: Ident, key: int) -> None:
        self.in_progress[ident] = key

    def finished(self, ident: Ident, answer: Answer) -> None:
        """Answered: remembered for retries still to come, the oldest forgotten first to
        stay within ``remember`` answers and ``remember_bytes``. One larger than the
        whole budget is not kept (nor does it push the others out)."""
        self.in_progress.pop(ident, None)
        old = self.answered.pop(ident, None)
        if old is not None:
            self.bytes_held -= weight(old)
        size = weight(answer)
        if size > self.remember_bytes:
            return
        self.answered[ident] = answer
        self.bytes_held += size
        while len(self.answered) > self.remember or self.bytes_held > self.remember_bytes:
            _, gone = self.answered.popitem(last=False)
            self.bytes_held -= weight(gone)

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
