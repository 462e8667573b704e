"""One request's wait for the shared quota desk, as a small pure machine.

::

    NEW     --start-------------------------------> ASKING   (ask the desk)
    ASKING  --admitted----------------------------> DONE     (admit)
    ASKING  --refused, holding within max_wait----> HELD     (until the booked slot)
    ASKING  --refused-----------------------------> DONE     (refuse, with the ticket)
    ASKING  --desk unreachable / past deadline----> DONE     (admit: availability first)
    HELD    --tick at the booked slot-------------> ASKING   (ask again, with the ticket)

Without an answer from the desk the request is served, and counted: a quota desk that
is down must not take the whole swarm down with it.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass

from hecate.wire.messages import QuotaReply


class QuotaState(enum.Enum):
    NEW = "new"
    ASKING = "asking"
    HELD = "held"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class AskDesk:
    ticket: int | None  # the slot booked for this request, once it has one


@dataclass(frozen=True, slots=True)
class Admit:
    unavailable: bool  # admitted without the desk's word


@dataclass(frozen=True, slots=True)
class Refuse:
    message: str
    retry_after_s: float
    ticket: int | None


QuotaAction = AskDesk | Admit | Refuse


def holds(wait_s: float, max_wait_ms: int) -> bool:
    """A tenant that prefers holding is held when its booked slot is within what the
    caller will wait (``max_wait_ms``), and refused with its ticket otherwise."""
    return wait_s * 1000 <= max_wait_ms


@dataclass(eq=False)
class QuotaWait:
    tenant: str
    max_wait_ms: int
    timeout_s: float
    counters: Counter[str]
    ticket: int | None = None
    state: QuotaState = QuotaState.NEW
    deadline: float = math.inf
    wake_at: float = math.inf

    def start(self, now: float) -> list[QuotaAction]:
        assert self.state is QuotaState.NEW
        return self._ask(now)

    def answered(self, reply: QuotaReply, now: float) -> list[QuotaAction]:
        if self.state is not QuotaState.ASKING:
            return []  # a late answer to an ask already given up on
        if reply.admitted:
            self.state = QuotaState.DONE
            return [Admit(unavailable=False)]
        wait = reply.retry_after_s
        self.ticket = reply.ticket
        if reply.hold and holds(wait, self.max_wait_ms):
            # Held, not refused: ask again with the ticket when the booked slot comes.
            self.counters["quota_held"] += 1
            self.state = QuotaState.HELD
            self.wake_at = now + wait
            return []
        self.counters["quota_refused"] += 1
        self.state = QuotaState.DONE
        message = (
            f"tenant {self.tenant!r} is over its quota; retry in {wait:.3f} s "
            "with the quota_ticket to claim the slot booked for you"
            if reply.ticket is not None
            # Past the desk's horizon nothing is booked: the wait is all it can say.
            else f"tenant {self.tenant!r} is over its quota as far ahead as the quota desk "
            f"books; retry in {wait:.3f} s"
        )
        return [Refuse(message, wait, reply.ticket)]

    def unreachable(self) -> list[QuotaAction]:
        """No responders, an unreadable answer, or the ask never left."""
        if self.state is not QuotaState.ASKING:
            return []
        self.counters["quota_unavailable"] += 1
        self.state = QuotaState.DONE
        return [Admit(unavailable=True)]

    def tick(self, now: float) -> list[QuotaAction]:
        if self.state is QuotaState.HELD and now >= self.wake_at:
            return self._ask(now)
        if self.state is QuotaState.ASKING and now > self.deadline:
            return self.unreachable()
        return []

    def _ask(self, now: float) -> list[QuotaAction]:
        self.state = QuotaState.ASKING
        self.deadline = now + self.timeout_s
        self.wake_at = math.inf
        return [AskDesk(self.ticket)]
