"""Token buckets that tell a rejected caller exactly when its turn comes, and keep it.

A bucket of ``burst`` tokens refilled at ``rate_per_s``, written as GCRA (virtual
scheduling): one number, the theoretical arrival time ``tat``, instead of a token count
and a refill timestamp. A request of cost ``c`` conforms at ``now`` when
``max(tat, now) + c/rate - now <= burst/rate``.

When a request does not conform, the bucket can **book** it: its capacity is taken
from the future (``tat`` advances as if it had been admitted), it is told the exact
moment its booking conforms (its Retry-After), and it gets a ticket. Coming back at
that moment with the ticket, it is admitted without competing again. That is what lets
a herd of rejected callers come back without colliding: each has its own slot, so no
one is rejected twice (the herd benchmark measures 1.9 attempts per success where 900
of 1,000 callers must wait, the floor for any reject-and-retry protocol).

Bookings reach no further than a **horizon** (by default the longest Retry-After this
project's callers honour): every booking pushes the next free slot later, so without
one a herd of 20,000 callers at 1 a second (a burst of 200) held 19,800 tickets and
told the last to wait 19,800 s. A refusal whose slot lies past the horizon books nothing and takes
nothing from the future; it is told to come back after the horizon, when every booking
made so far has come due. Bookings nobody came back for are forgotten once their slot
is ``ticket_ttl_s`` past, oldest first: what a bucket holds is bounded by the slots
between ``now - ticket_ttl_s`` and ``now + horizon_s``.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

import msgspec

from hecate.resilience.hints import DEFAULT_CAP_S

EPSILON = 1e-9  # float slack when a caller returns exactly at its slot
# A caller told to wait longer than a client reads from Retry-After would come back
# early, and be refused again: no booking reaches further.
DEFAULT_HORIZON_S = DEFAULT_CAP_S


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to one request: admitted now, or come back in ``retry_after_s``."""

    admitted: bool
    retry_after_s: float = 0.0
    ticket: int | None = None  # present a rejected booking's ticket when coming back


class TokenBucket:
    """Not thread-safe; one owner (a router's quota, or the breaker service)."""

    def __init__(
        self,
        rate_per_s: float,
        burst: float,
        *,
        book: bool = True,
        ticket_ttl_s: float = 300.0,
        grace_s: float | None = None,
        horizon_s: float = DEFAULT_HORIZON_S,
    ) -> None:
        if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
            raise ValueError(f"rate_per_s must be positive and finite, got {rate_per_s}")
        if not (burst >= 1 and math.isfinite(burst)):
            raise ValueError(f"burst must be at least 1, got {burst}")
        if not horizon_s > 0:
            raise ValueError(f"horizon_s must be positive, got {horizon_s}")
        self.rate = rate_per_s
        self.burst = burst
        self.book = book
        self.ticket_ttl_s = ticket_ttl_s
        # A booking is honoured if redeemed within the time the bucket takes to refill:
        # a late caller then adds at most one burst on top of the limit.
        self.grace_s = burst / rate_per_s if grace_s is None else grace_s
        self.horizon_s = horizon_s
        self.tat = -math.inf
        self._tickets: dict[int, float] = {}  # ticket -> slot, while the booking is held
        # (slot, ticket) as booked: tat only moves forward, so this is in slot order too.
        self._booked: deque[tuple[float, int]] = deque()
        self._ids = itertools.count(1)

    @property
    def bookings(self) -> int:
        """Bookings held: neither redeemed nor forgotten yet."""
        return len(self._tickets)

    def holds(self, ticket: int) -> bool:
        return ticket in self._tickets

    def books(self, slot: float, now: float) -> bool:
        """Whether a refusal at ``now`` of a request conforming at ``slot`` is booked."""
        return self.book and slot - now <= self.horizon_s + EPSILON

    def conforms_at(self, now: float, cost: float = 1.0) -> float:
        """The earliest time a request of ``cost`` would conform (``<= now``: now)."""
        tat = max(self.tat, now) + cost / self.rate
        return tat - self.burst / self.rate

    def try_acquire(self, now: float, cost: float = 1.0, ticket: int | None = None) -> Admission:
        """Admit now, or refuse with the exact wait (and, when booking, a ticket)."""
        self.forget(now)
        if ticket is not None and ticket in self._tickets:
            slot = self._tickets[ticket]
            if now + EPSILON < slot:
                return Admission(admitted=False, retry_after_s=slot - now, ticket=ticket)
            del self._tickets[ticket]
            if now <= slot + self.grace_s:
                return Admission(admitted=True)  # its capacity was booked when refused
            # Too late: the booked capacity belonged to a moment long gone; admitting now
            # would exceed the limit. The caller queues again like anyone else.
        if cost > self.burst:
            raise ValueError(f"cost {cost} can never fit a bucket of {self.burst}")
        slot = self.conforms_at(now, cost)
        if slot <= now + EPSILON:
            self.tat = max(self.tat, now) + cost / self.rate
            return Admission(admitted=True)
        if not self.book:
            return Admission(admitted=False, retry_after_s=slot - now)
        if not self.books(slot, now):
            # Past the horizon: nothing booked, nothing pushed later. By the horizon every
            # slot booked so far has come due, and one can be booked for this caller.
            return Admission(admitted=False, retry_after_s=self.horizon_s)
        self.tat = max(self.tat, now) + cost / self.rate  # the capacity is now this caller's
        booked = next(self._ids)
        self._tickets[booked] = slot
        self._booked.append((slot, booked))
        return Admission(admitted=False, retry_after_s=slot - now, ticket=booked)

    def forget(self, now: float) -> None:
        """Drop the bookings whose slot is more than ``ticket_ttl_s`` past: nobody came
        back for them. Oldest first, so only those that go are looked at."""
        line = self._booked
        while line and line[0][0] < now - self.ticket_ttl_s:
            _, ticket = line.popleft()
            self._tickets.pop(ticket, None)  # gone already if it was redeemed


class Quota:
    """A tenant's budget: requests per minute and tokens per minute, booked together."""

    def __init__(
        self,
        requests_per_min: float,
        tokens_per_min: float | None = None,
        *,
        burst: float | None = None,
        horizon_s: float = DEFAULT_HORIZON_S,
    ) -> None:
        """``burst``: requests admitted at once from a full bucket (default: a minute's)."""
        self.requests = TokenBucket(
            requests_per_min / 60.0,
            max(1.0, burst if burst is not None else requests_per_min),
            horizon_s=horizon_s,
        )
        self.tokens = (
            TokenBucket(tokens_per_min / 60.0, max(1.0, tokens_per_min), horizon_s=horizon_s)
            if tokens_per_min
            else None
        )
        # ticket -> (requests part, tokens part): each the bucket's ticket, None once paid
        self._tickets: dict[int, tuple[int | None, int | None]] = {}
        # Tickets as booked. Every booking takes a request, booked or paid at once, so
        # these are in the order of their requests part's slots, and go in that order
        # (but for a part booked afresh after a late return, which holds up those behind
        # it no longer than its new slot and ttl).
        self._booked: deque[int] = deque()
        self._ids = itertools.count(1)

    @property
    def bookings(self) -> int:
        """Quota tickets held: neither redeemed nor forgotten yet."""
        return len(self._tickets)

    def try_acquire(self, now: float, tokens: int = 0, ticket: int | None = None) -> Admission:
        self._forget(now)
        if ticket is not None and ticket in self._tickets:
            return self._redeem(now, ticket)
        cost = float(min(tokens, self.tokens.burst)) if self.tokens is not None else 0.0
        r_slot = self.requests.conforms_at(now, 1.0)
        t_slot = self.tokens.conforms_at(now, cost) if self.tokens is not None else -math.inf
        if max(r_slot, t_slot) <= now + EPSILON:
            self.requests.try_acquire(now, 1.0)
            if self.tokens is not None:
                self.tokens.try_acquire(now, cost)
            return Admission(admitted=True)
        if not self.requests.books(r_slot, now) or (
            self.tokens is not None and not self.tokens.books(t_slot, now)
        ):
            # One part lies past its horizon: neither is booked (half a booking would take
            # capacity from the other budget for a ticket that cannot be had).
            waits = [min(r_slot - now, self.requests.horizon_s)]
            if self.tokens is not None:
                waits.append(min(t_slot - now, self.tokens.horizon_s))
            return Admission(admitted=False, retry_after_s=max(waits))
        req = self.requests.try_acquire(now, 1.0)  # books whichever is short, or both
        tok = self.tokens.try_acquire(now, cost) if self.tokens is not None else None
        booked = next(self._ids)
        self._tickets[booked] = (req.ticket, tok.ticket if tok is not None else None)
        self._booked.append(booked)
        wait = max(req.retry_after_s, tok.retry_after_s if tok is not None else 0.0)
        return Admission(admitted=False, retry_after_s=wait, ticket=booked)

    def _redeem(self, now: float, ticket: int) -> Admission:
        r_ticket, t_ticket = self._tickets[ticket]
        paid = Admission(admitted=True)  # a part admitted when booking is already paid
        r = paid if r_ticket is None else self.requests.try_acquire(now, 1.0, r_ticket)
        t = (
            paid
            if t_ticket is None or self.tokens is None
            else self.tokens.try_acquire(now, 0.0, t_ticket)
        )
        if r.admitted and t.admitted:
            del self._tickets[ticket]
            return Admission(admitted=True)
        wait = max(r.retry_after_s, t.retry_after_s)
        if (not r.admitted and r.ticket is None) or (not t.admitted and t.ticket is None):
            # A part came back too late and its bucket is booked past the horizon: the
            # ticket claims nothing any more, and the caller comes back as a newcomer.
            del self._tickets[ticket]
            return Admission(admitted=False, retry_after_s=wait)
        # A part that came back too late is booked afresh, under a ticket of its own:
        # the quota ticket now holds that one.
        self._tickets[ticket] = (
            None if r.admitted else r.ticket,
            None if t.admitted else t.ticket,
        )
        return Admission(admitted=False, retry_after_s=wait, ticket=ticket)

    def _forget(self, now: float) -> None:
        """Forget the quota tickets whose every unpaid part its bucket has forgotten,
        oldest first: only those that go are looked at."""
        self.requests.forget(now)
        if self.tokens is not None:
            self.tokens.forget(now)
        while self._booked:
            parts = self._tickets.get(self._booked[0])
            if parts is not None and self._holds(parts):
                break
            self._tickets.pop(self._booked.popleft(), None)

    def _holds(self, parts: tuple[int | None, int | None]) -> bool:
        r_ticket, t_ticket = parts
        if r_ticket is not None and self.requests.holds(r_ticket):
            return True
        return t_ticket is not None and self.tokens is not None and self.tokens.holds(t_ticket)
