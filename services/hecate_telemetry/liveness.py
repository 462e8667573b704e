"""Is a node silent, or only slow? A phi-accrual failure detector (Hayashibara et al.).

A fixed rule ("down after 3 missed 100 ms heartbeats") cannot tell a dead node from a
busy one: under load a live node's heartbeats come 200-400 ms apart, and the rule
declares it dead. The detector instead learns, per node, how its heartbeats have been
arriving (a bounded window of inter-arrival times) and asks how unlikely the current
silence is under that history:

    phi(now) = -log10(1 - CDF(now - last heartbeat))

with CDF the normal distribution of the window's mean (plus ``acceptable_pause_s``) and
standard deviation (never below ``min_std_s``). ``phi = 8`` means "a live node with this
history would stay this silent once in 10^8 times". A node is suspected when phi reaches
``threshold``; so a node that has been jittery is given more rope than a regular one,
and one that is regular again is held to its regular pace as the window forgets.

Rules, and why:

* **The std has a floor**: a perfectly regular node would otherwise be suspected for
  being a millisecond late.
* **An acceptable pause** is added to the mean: a garbage collection or a page fault is
  not a death, whatever the history says.
* **Never before ``min_missed`` declared intervals**: an operator's "at least N missed
  heartbeats" still holds (the telemetry service's ``--missed``).
* **Always by ``max_silence_s``**: however jittery a node has been, a silence this long
  is a death; no history buys a node more.
* **Too few samples**: until a node has ``min_samples`` intervals, its declared heartbeat
  interval stands in for the window's mean (a new node is judged as a regular one).
* **Silence nobody watched is nobody's**: :meth:`FailureDetector.blind` moves every
  node's last heartbeat forward by a span the observer itself was not running (its
  event loop stalled), so that span counts neither as silence nor as a gap.
* **A node loading is starting, not failing**: a node says in its beats that it is
  loading its ranges (weights, tokenizer, the first warm-up pass), when native code may
  hold its interpreter and its heartbeats with it; until a beat says it has finished it
  is judged by ``loading_silence_s`` alone, and the gaps of its load are learnt neither
  as its pace nor as its jitter.

:class:`Link` is the observer's own side: when its link to the bus last proved it
works, which is what every node's silence is measured up to.

Pure: the clock is passed in (``now``, monotonic seconds); nothing here does I/O.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

import msgspec


class LivenessConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The defaults declare a SIGKILLed node that heartbeated every 100 ms like clockwork
    down 0.48 s after its last heartbeat (0.1 + 0.1 + 5.61 x 0.05), while a node whose
    heartbeats have come 200-400 ms apart keeps its place for 0.58-0.83 s of silence
    (tests/services/telemetry/test_liveness.py computes both)."""

    threshold: float = 8.0  # phi at which a node is suspected (Akka's and Cassandra's 8)
    window: int = 100  # inter-arrival times kept per node (10 s of 100 ms heartbeats)
    min_samples: int = 5  # below this, the declared interval stands in for the mean
    min_std_s: float = 0.05
    acceptable_pause_s: float = 0.1
    min_missed: float = 0.0  # declared heartbeat intervals of silence always allowed
    max_silence_s: float = 5.0
    # The silence a node that said it is loading is allowed instead. On two cores, with
    # the whole swarm starting, SmolLM2's end stages went 0.3-0.9 s between beats while
    # they built their tokenizer (native code holding the interpreter: 0.14 s alone on
    # an idle machine), and one building its weights from the GGUF up to 0.5 s alone:
    # ten seconds is ten times the worst, and a load that says nothing for longer hangs.
    loading_silence_s: float = 10.0

    def __post_init__(self) -> None:
        # phi <= log10(2) while the silence is below the mean: a threshold above that
        # keeps a node heard just now from ever being suspected.
        if not self.threshold > math.log10(2):
            raise ValueError(f"threshold must exceed log10(2), got {self.threshold}")
        if self.window < 1 or self.min_samples < 1:
            raise ValueError("window and min_samples must be at least 1")
        if not (self.min_std_s > 0 and self.acceptable_pause_s >= 0):
            raise ValueError("min_std_s must be positive and acceptable_pause_s not negative")
        if not (self.min_missed >= 0 and self.max_silence_s > 0):
            raise ValueError("min_missed must not be negative and max_silence_s must be positive")
        if not self.loading_silence_s > 0:
            raise ValueError("loading_silence_s must be positive")


def phi(elapsed: float, mean: float, std: float) -> float:
    """``-log10`` of the chance that a heartbeat due after a normal(mean, std) gap is
    still to come ``elapsed`` seconds after the last one; ``inf`` once that chance
    underflows."""
    later = 0.5 * math.erfc((elapsed - mean) / (std * math.sqrt(2)))
    return -math.log10(later) if later > 0 else math.inf


#: A declared interval this many times the last (or its inverse) is a new pace.
PACE_CHANGE = 1.5


class Arrivals:
    """One node's heartbeat history: the last arrival, a window of gaps, and whether
    its last beat said it was loading."""

    __slots__ = ("gaps", "interval_s", "last", "loading", "mean", "std")

    def __init__(self, now: float, interval_s: float, window: int, loading: bool) -> None:
        self.last = now
        self.interval_s = interval_s
        self.gaps: deque[float] = deque(maxlen=window)
        self.mean = interval_s
        self.std = 0.0
        self.loading = loading

    def add(self, now: float, interval_s: float, loading: bool) -> None:
        # A gap that ends in a load or spans one is the load's pace, not the node's: it
        # is not learnt, and the node's gaps take up again from the first beat after it.
        # So with a new pace (a node slowing its beats as the swarm grows says so in the
        # beat before the first longer gap): the gaps learnt at the old one are dropped,
        # and the declared interval stands in until enough at the new one are.
        was_loading, self.loading = self.loading, loading
        repaced = not (1 / PACE_CHANGE <= interval_s / self.interval_s <= PACE_CHANGE)
        self.interval_s = interval_s
        if repaced:
            self.gaps.clear()
            self.mean, self.std = interval_s, 0.0
            self.last = max(self.last, now)
            return
        if loading or was_loading:
            self.last = max(self.last, now)
            return
        self.gaps.append(max(0.0, now - self.last))
        self.last = max(self.last, now)
        n = len(self.gaps)
        self.mean = sum(self.gaps) / n
        self.std = math.sqrt(sum((g - self.mean) ** 2 for g in self.gaps) / n)


class FailureDetector:
    """Phi accrual per node. Feed it heartbeats; ask it who is suspected."""

    def __init__(self, config: LivenessConfig | None = None) -> None:
        self.config = config or LivenessConfig()
        self.nodes: dict[str, Arrivals] = {}

    def heartbeat(
        self, node_id: str, now: float, interval_s: float, *, loading: bool = False
    ) -> None:
        """A heartbeat from ``node_id`` arrived at ``now``; it declares ``interval_s``,
        and says whether the node is loading its ranges."""
        seen = self.nodes.get(node_id)
        if seen is None:
            self.nodes[node_id] = Arrivals(now, interval_s, self.config.window, loading)
        else:
            seen.add(now, interval_s, loading)

    def forget(self, node_id: str) -> None:
        """The node left: a newcomer by the same name starts with no history."""
        self.nodes.pop(node_id, None)

    def blind(self, now: float, seconds: float) -> None:
        """The observer did not run for ``seconds`` before ``now``: that span counts
        against nobody (never past ``now``)."""
        if seconds <= 0:
            return
        for seen in self.nodes.values():
            seen.last = min(seen.last + seconds, max(seen.last, now))

    def deaf_until(self, when: float) -> None:
        """The observer could hear nobody before ``when`` (it was cut off from the bus):
        silence before then counts against nobody."""
        for seen in self.nodes.values():
            seen.last = max(seen.last, when)

    # -- reading -----------------------------------------------------------------------

    def loading(self, node_id: str) -> bool:
        """Whether the node's last beat said it was loading (judged by
        ``loading_silence_s`` alone until one says it is not)."""
        seen = self.nodes.get(node_id)
        return seen is not None and seen.loading

    def silence(self, node_id: str, now: float) -> float:
        """Seconds since the last heartbeat of ``node_id`` (``inf``: never heard)."""
        seen = self.nodes.get(node_id)
        return math.inf if seen is None else max(0.0, now - seen.last)

    def expected(self, node_id: str) -> tuple[float, float]:
        """The ``(mean, std)`` gap the node is judged by, pause and floor included."""
        c = self.config
        seen = self.nodes[node_id]
        if len(seen.gaps) < c.min_samples:
            return seen.interval_s + c.acceptable_pause_s, c.min_std_s
        return seen.mean + c.acceptable_pause_s, max(seen.std, c.min_std_s)

    def phi(self, node_id: str, now: float) -> float:
        """How unlikely the node's current silence is, given its history (0: not at all)."""
        if node_id not in self.nodes:
            return math.inf
        mean, std = self.expected(node_id)
        return max(0.0, phi(self.silence(node_id, now), mean, std))

    def min_silence(self, node_id: str) -> float:
        """The silence always allowed: ``min_missed`` declared intervals, at most
        ``max_silence_s``."""
        c = self.config
        return min(c.min_missed * self.nodes[node_id].interval_s, c.max_silence_s)

    def suspected(self, node_id: str, now: float) -> bool:
        if node_id not in self.nodes:
            return True
        silent = self.silence(node_id, now)
        if self.loading(node_id):
            return silent >= self.config.loading_silence_s
        if silent >= self.config.max_silence_s:
            return True
        return silent >= self.min_silence(node_id) and self.phi(node_id, now) >= (
            self.config.threshold
        )

    def patience(self, node_id: str) -> float:
        """The silence, in seconds, at which the node would be suspected now: what its
        history buys it (never more than ``max_silence_s``), or, loading, what a load is
        allowed."""
        c = self.config
        if self.loading(node_id):
            return c.loading_silence_s
        mean, std = self.expected(node_id)
        if phi(c.max_silence_s, mean, std) < c.threshold:
            return c.max_silence_s
        low, high = 0.0, c.max_silence_s
        for _ in range(60):  # phi is monotone in the silence: bisect to below a microsecond
            mid = (low + high) / 2
            low, high = (mid, high) if phi(mid, mean, std) < c.threshold else (low, mid)
        return max(high, self.min_silence(node_id))


#: A link whose latest proof is older than this (and than two sweeps) is taken for
#: silent: counted and logged, never held against the nodes.
DEAF_AFTER_S = 0.25

LinkNews = Literal["silent", "answers again"]


class Link:
    """The observer's own link to the bus, as far as its pings prove it works.

    Every heartbeat the server had when a PING went out comes in before its PONG, so
    the moment the latest answered PING went out is the last moment the observer is
    known to have heard everyone: silence is measured up to there, never up to now (a
    link held open and mute, its server cut off, would make every node look dead).

    The link is first proven by the PING that made the observer ready, at the moment
    that PING went out: its silence counts from there, never from the clock's zero,
    which on a monotonic clock is the machine's boot and would make a link that just
    started look silent for the machine's uptime.

    Pure: the observer sends the pings and says when each one answered went out."""

    __slots__ = ("deaf", "deaf_after_s", "deaf_sweeps", "proven_at")

    def __init__(self, proven_at: float, deaf_after_s: float = DEAF_AFTER_S) -> None:
        self.proven_at = proven_at
        self.deaf_after_s = deaf_after_s
        self.deaf = False  # in a spell of sweeps whose link was not proven lately
        self.deaf_sweeps = 0

    def answered(self, sent_at: float) -> None:
        """The PING that went out at ``sent_at`` was answered."""
        self.proven_at = max(self.proven_at, sent_at)

    def blind(self, now: float, seconds: float) -> None:
        """The observer did not run for ``seconds`` before ``now``: it could not read a
        PONG meanwhile, so that span is no silence of the link (never past ``now``), as
        :meth:`FailureDetector.blind` moves every node's last beat by the same span."""
        if seconds > 0:
            self.proven_at = min(self.proven_at + seconds, max(self.proven_at, now))

    def silent_for(self, now: float) -> float:
        """Seconds since the link last proved it works."""
        return max(0.0, now - self.proven_at)

    def sweep(self, now: float, period: float) -> LinkNews | None:
        """A sweep at ``now`` (``period`` after the last): counted deaf when the link has
        not proved itself within two sweeps and ``deaf_after_s``. The news, once per
        spell: ``"silent"`` as one starts, ``"answers again"`` as it ends."""
        deaf = self.silent_for(now) > max(2 * period, self.deaf_after_s)
        news: LinkNews | None = None
        if deaf:
            self.deaf_sweeps += 1
            if not self.deaf:
                news = "silent"
        elif self.deaf:
            news = "answers again"
        self.deaf = deaf
        return news
