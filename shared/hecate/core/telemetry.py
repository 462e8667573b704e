"""Node telemetry: cheap, constantly changing, smoothed with an EWMA.

A field that was never measured is ``None``, never a made-up number: the cost model
decides how to penalise the unknown (see :mod:`hecate.core.cost`), and the age of every
measurement stays visible so a caller can tell fresh numbers from stale ones.
"""

from __future__ import annotations

import math

import msgspec

DEFAULT_ALPHA = 0.3
"""Weight of the newest sample. 0.3 follows a step change within ~7 samples (to 90 %)
while one outlier moves the estimate by less than a third."""


class NodeState(msgspec.Struct, frozen=True, kw_only=True):
    """How a node is doing now, as far as this snapshot knows.

    ``in_flight`` is the work outstanding on the node as last reported (its queue
    depth); a router adds its own not-yet-reported dispatches on top (see
    :class:`hecate.core.router.Router`).
    """

    alive: bool = True
    latency_ms: float | None = None
    load: float | None = None
    score: float | None = None
    last_seen: float | None = None
    in_flight: int = 0

    @property
    def measured(self) -> bool:
        return self.last_seen is not None

    def age(self, now: float) -> float:
        """Seconds since the last measurement; ``inf`` when the node was never measured."""
        if self.last_seen is None:
            return math.inf
        return max(0.0, now - self.last_seen)


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    """One measurement of a node. Any field may be absent; absent fields keep their estimate."""

    latency_ms: float | None = None
    load: float | None = None
    score: float | None = None
    in_flight: int | None = None


def ewma(previous: float | None, value: float, alpha: float) -> float:
    """Exponentially weighted moving average; the first sample is taken as is."""
    if previous is None:
        return value
    return previous + alpha * (value - previous)


def _clean(value: float | None, lo: float, hi: float = math.inf) -> float | None:
    """A finite value clamped to ``[lo, hi]``, or ``None`` for absent/NaN/inf.

    Telemetry comes from other processes: garbage is dropped, not propagated into costs.
    """
    if value is None or not math.isfinite(value):
        return None
    return min(max(value, lo), hi)


def observe(
    state: NodeState, sample: Sample, *, now: float, alpha: float = DEFAULT_ALPHA
) -> NodeState:
    """Fold one sample into a node's state. A sample proves the node is alive."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    latency = _clean(sample.latency_ms, 0.0)
    load = _clean(sample.load, 0.0, 1.0)
    score = _clean(sample.score, 0.0)
    in_flight = state.in_flight if sample.in_flight is None else max(0, sample.in_flight)
    return NodeState(
        alive=True,
        latency_ms=state.latency_ms if latency is None else ewma(state.latency_ms, latency, alpha),
        load=state.load if load is None else ewma(state.load, load, alpha),
        score=state.score if score is None else ewma(state.score, score, alpha),
        last_seen=now,
        in_flight=in_flight,
    )


#: Heartbeats a second a swarm's nodes send in all, by default: what one telemetry
#: replica takes with room to spare (it spends 50-100 µs a beat); several replicas
#: sharing the intake take as many each.
BEAT_BUDGET_PER_S = 2000.0


def beat_interval(base_s: float, nodes: int, budget_per_s: float, most_s: float) -> float:
    """How often a node of a swarm of ``nodes`` heartbeats: every ``base_s`` while the
    whole swarm's beats stay within ``budget_per_s``, slower as it grows so that they do,
    never slower than every ``most_s`` (failure detection waits on the beats: past
    ``budget_per_s * most_s`` nodes the budget gives way, not detection)."""
    return min(max(base_s, nodes / budget_per_s), max(base_s, most_s))
