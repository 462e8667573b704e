"""A circuit breaker per target: CLOSED → OPEN → HALF_OPEN → CLOSED, as a table.

Everything that changes the state is in :data:`TRANSITIONS` below; the methods only
work out which event happened and apply the row. Time is injected (``clock``), so
tests drive it with a fake clock and the bus service can use wall time shared by
every router.

Rules, and why:

* **Trip**: ``failure_threshold`` *consecutive* failures (429/5xx) within ``window_s``.
  A success resets the count (the seed's breaker never did, so its "consecutive"
  failures were not consecutive).
* **Cooldown**: an open circuit rejects for ``cooldown_s``, or longer when the failure
  that tripped it carried a longer Retry-After: opening for less than the upstream
  asked would only earn another 429.
* **Exactly one probe**: after the cooldown the first ``allow()`` is the probe; every
  other call is rejected until the probe reports.
* **A probe cannot strand the breaker**: a probe that never reports back counts as
  failed after ``probe_timeout_s`` and the circuit re-opens with a fresh cooldown
  (resilience4j users saw breakers stuck in HALF_OPEN when a permit was never
  released).
* **The cause is kept**: the code of the failure that opened the circuit (or held it
  open longer) is in the snapshot, so whoever learns that the cause is gone can act.
* **A target known to be back skips the rest of its cooldown** (``revive``): the circuit
  turns HALF_OPEN at once, so one probe still tests it. The cooldown guesses how long a
  fault lasts; news that the target is back is better than a guess. Which news is good
  enough for which cause is the caller's rule, not the table's.
* An open circuit rejects with one comparison: microseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import msgspec

State = Literal["closed", "open", "half_open"]
Event = Literal[
    "success",
    "failure",
    "trip",
    "reject",
    "cooldown_over",
    "probe",
    "probe_expired",
    "late",
    "revived",
]

TRANSITIONS: dict[tuple[State, Event], State] = {
    # state        event             next state     (effect, applied by the breaker)
    ("closed", "success"): "closed",  # failure streak cleared
    ("closed", "failure"): "closed",  # failure added to the streak
    ("closed", "trip"): "open",  # streak reached the threshold: open for the cooldown
    ("open", "reject"): "open",  # still cooling down
    ("open", "late"): "open",  # a result from before the trip; a longer hint extends
    ("open", "cooldown_over"): "half_open",  # time passed: ready for one probe
    ("open", "revived"): "half_open",  # the target is back: ready for one probe now
    ("half_open", "probe"): "half_open",  # the one probe is admitted
    ("half_open", "reject"): "half_open",  # a probe is already out
    ("half_open", "late"): "half_open",  # a failure while no probe is out: from before
    ("half_open", "success"): "closed",  # the probe succeeded: reset everything
    ("half_open", "failure"): "open",  # the probe failed: fresh cooldown
    ("half_open", "probe_expired"): "open",  # the probe never reported: fresh cooldown
}


class BreakerConfig(msgspec.Struct, frozen=True, kw_only=True):
    failure_threshold: int = 5
    window_s: float = 30.0
    cooldown_s: float = 60.0
    probe_timeout_s: float = 30.0
    max_open_s: float = 3600.0  # the longest a Retry-After hint may hold the circuit open


class BreakerSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the breaker knows: what the bus stores per target."""

    state: State = "closed"
    failures: tuple[float, ...] = ()  # times of the current consecutive failures
    open_until: float = 0.0
    probe_started: float | None = None
    trips: int = 0
    cause: str = ""  # the code of the failure that opened the circuit or held it open


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 5,
        window_s: float = 30.0,
        cooldown_s: float = 60.0,
        probe_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_open_s: float = 3600.0,
        snapshot: BreakerSnapshot | None = None,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self.config = BreakerConfig(
            failure_threshold=failure_threshold,
            window_s=window_s,
            cooldown_s=cooldown_s,
            probe_timeout_s=probe_timeout_s,
            max_open_s=max_open_s,
        )
        self.clock = clock
        self.snap = snapshot or BreakerSnapshot()
        self.history: list[tuple[State, Event, State]] = []  # transitions taken, for tests

    # -- the table ---------------------------------------------------------------------

    def _apply(self, event: Event, **changes: object) -> State:
        before = self.snap.state
        after = TRANSITIONS[(before, event)]
        self.snap = msgspec.structs.replace(self.snap, state=after, **changes)
        if after != before:
            self.history.append((before, event, after))
        return after

    def _advance(self, now: float) -> None:
        """Apply the transitions time alone causes."""
        s = self.snap
        if s.state == "open" and now >= s.open_until:
            self._apply("cooldown_over", probe_started=None)
        elif (
            s.state == "half_open"
            and s.probe_started is not None
            and now - s.probe_started >= self.config.probe_timeout_s
        ):
            # The cooldown runs from when the probe expired, not from when we noticed.
            expired = s.probe_started + self.config.probe_timeout_s
            self._open(expired, hint=None, event="probe_expired", cause="probe expired")
            self._advance(now)  # that cooldown may itself be over already

    def _open(self, now: float, hint: float | None, event: Event, cause: str) -> None:
        hold = max(self.config.cooldown_s, min(hint or 0.0, self.config.max_open_s))
        self._apply(
            event,
            open_until=now + hold,
            failures=(),
            probe_started=None,
            trips=self.snap.trips + 1,
            cause=cause,
        )

    # -- the interface -----------------------------------------------------------------

    @property
    def state(self) -> State:
        self._advance(self.clock())
        return self.snap.state

    def allow(self) -> bool:
        """May a request go to the target now? In HALF_OPEN, True exactly once."""
        s = self.snap
        if s.state == "closed":
            return True
        now = self.clock()
        if s.state == "open" and now < s.open_until:
            return False  # the hot path of an open circuit: one comparison
        self._advance(now)
        if self.snap.state == "half_open" and self.snap.probe_started is None:
            self._apply("probe", probe_started=now)
            return True
        self._apply("reject")
        return False

    def record_success(self) -> None:
        now = self.clock()
        self._advance(now)
        if self.snap.state == "open":
            self._apply("late")
        else:
            self._apply("success", failures=(), probe_started=None)

    def record_failure(self, retry_after_s: float | None = None, code: str = "") -> None:
        """A call failed; ``code`` says how (kept as the cause if this opens the circuit)."""
        now = self.clock()
        self._advance(now)
        s = self.snap
        if s.state == "open":
            longer = now + min(retry_after_s or 0.0, self.config.max_open_s)
            if longer > s.open_until:  # the hold is now this failure's doing
                self._apply("late", open_until=longer, cause=code)
            else:
                self._apply("late")
        elif s.state == "half_open" and s.probe_started is None:
            # Nothing was admitted since the circuit opened, so this is an old call's
            # failure (one that timed out after its node came back, say), not the probe's.
            self._apply("late")
        elif s.state == "half_open":
            self._open(now, retry_after_s, "failure", code)
        else:
            streak = (*(t for t in s.failures if now - t <= self.config.window_s), now)
            if len(streak) >= self.config.failure_threshold:
                self._open(now, retry_after_s, "trip", code)
            else:
                self._apply("failure", failures=streak)

    def revive(self) -> bool:
        """The target is known to be back: an open circuit skips the rest of its
        cooldown and turns half-open, ready for one probe. True if it did (a closed or
        half-open circuit is left as it is: the probe, if out, decides)."""
        now = self.clock()
        self._advance(now)
        if self.snap.state != "open":
            return False
        self._apply("revived", open_until=now, probe_started=None)
        return True

    def retry_in(self) -> float:
        """Seconds until a request could be admitted (0 when ``allow()`` would say yes).

        While a probe is out that is when it expires, at the latest."""
        now = self.clock()
        self._advance(now)
        s = self.snap
        if s.state == "open":
            return max(0.0, s.open_until - now)
        if s.state == "half_open" and s.probe_started is not None:
            return max(0.0, s.probe_started + self.config.probe_timeout_s - now)
        return 0.0
