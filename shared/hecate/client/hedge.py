"""When a caller sends its request again without giving up on the first send: pure, no
I/O, the clock passed in.

The rule, all of it:

* **Hedge only on silence.** A send that has had no reply, and (streamed) no token,
  for ``delay_s()`` gets a hedge: the same request, the same ``request_id``, the next
  attempt number, on a fresh inbox. Every earlier send stays outstanding and the first
  answer wins. Routers make this safe: a live owner joins the hedge to its running
  flight (nothing runs twice); a dead or frozen one claims nothing within the claim
  window and the router the hedge reached runs it.
* **Never while a stream flows.** A token from any send is a reply in progress: the
  silence clock restarts at each token.
* **The delay comes from what this client saw.** ``multiple`` times a running estimate
  of its recent routed latency (an exponentially weighted mean of answered sends),
  floored at ``floor_s`` (no hedge storm on a fast swarm's jitter) and capped at
  ``cap_s`` (a slow swarm still gets a hedge well before the timeout). A slow but
  healthy swarm raises its own estimate, and so its delay: slowness is not silence.
* **Bounded.** At most ``max_outstanding`` sends of one call are in flight at once;
  the call's overall timeout is not changed by hedging.

Routers treat a request that waited in a frozen router's socket like a retry (they ask
the other replicas before running it, see services/hecate_router/retries.py); their
stall threshold is below ``FLOOR_S``, so a request old enough to have been hedged is old
enough to be asked about.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR_S = 0.25  # never hedge sooner: a healthy swarm's jitter is not a dead router
MULTIPLE = 4.0  # a reply this many times slower than usual is treated as lost
MAX_OUTSTANDING = 3  # sends of one call in flight at once
ALPHA = 0.2  # weight of the newest latency in the running estimate


def cap_of(timeout_s: float, floor_s: float = FLOOR_S) -> float:
    """The longest hedge delay for a call with this timeout: half of it, so that a
    hedge always has time to be answered, and never below the floor."""
    return max(floor_s, timeout_s / 2)


@dataclass
class LatencyEstimate:
    """A running estimate of how long an answered send takes (seconds)."""

    mean_s: float | None = None
    alpha: float = ALPHA

    def observe(self, latency_s: float) -> None:
        x = max(0.0, latency_s)
        self.mean_s = x if self.mean_s is None else self.mean_s + self.alpha * (x - self.mean_s)


@dataclass
class Hedge:
    """One call's hedging: when the next hedge is due, and whether one may go now.

    ``estimate_s``: the client's latency estimate when the call began (None before
    any answer: the delay is then the cap)."""

    estimate_s: float | None
    cap_s: float
    floor_s: float = FLOOR_S
    multiple: float = MULTIPLE
    max_outstanding: int = MAX_OUTSTANDING
    outstanding: int = 0
    hedges: int = 0
    _quiet_since: float = 0.0

    def delay_s(self) -> float:
        cap = max(self.floor_s, self.cap_s)
        if self.estimate_s is None:
            return cap
        return min(cap, max(self.floor_s, self.multiple * self.estimate_s))

    def sent(self, now: float) -> None:
        """A send went out (the first or a hedge): the silence clock restarts."""
        self.outstanding += 1
        self._quiet_since = now

    def heard(self, now: float) -> None:
        """A token arrived on some send: the request is alive, restart the clock."""
        self._quiet_since = now

    def gone(self) -> None:
        """A send ended without an answer the call keeps (no responders, say)."""
        self.outstanding = max(0, self.outstanding - 1)

    def due_at(self) -> float | None:
        """When the next hedge goes out if nothing is heard; None if none may."""
        if self.outstanding == 0 or self.outstanding >= self.max_outstanding:
            return None
        return self._quiet_since + self.delay_s()

    def should_hedge(self, now: float) -> bool:
        due = self.due_at()
        return due is not None and now >= due

    def hedged(self, now: float) -> None:
        self.hedges += 1
        self.sent(now)
