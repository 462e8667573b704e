"""When the fault proxy may pass on the bytes it read: the pure half of
:mod:`hecate_dev.chaos.proxy`, with no socket and no clock of its own (``now`` is given).

One :class:`LinkSchedule` per direction of one proxied connection. A chunk read at
``now`` is first delayed by the latency, plus a jitter drawn in ``[0, jitter]``, then
serialised at the bandwidth, cut into segments so that no burst exceeds the rate for
long. Its rules:

- **Order.** Release times never decrease: a chunk drawn a shorter delay than the one
  before it waits for that one (head-of-line, as TCP does), so jitter never reorders
  the bytes of one stream.
- **Latency.** Every byte is released at least ``latency`` after it was read; with no
  bandwidth limit, at most ``latency + jitter`` after (the wait behind an earlier chunk
  is bounded by that chunk's own delay).
- **Bandwidth.** Over any window of length ``w``, at most ``bandwidth * w`` bytes plus
  one segment are released: each segment takes ``size / bandwidth`` seconds of the link,
  and a segment is released when the link has finished sending it.

Toxics may change at any moment: bytes already scheduled keep their times, later ones
take the new figures, and the order rule still holds across the change.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

__all__ = ["Direction", "LinkSchedule", "Release", "Toxics", "segment_bytes"]

# A segment carries this much of the rate's time at most: fine enough that a slow link
# looks smooth, coarse enough that a fast one is not written a few bytes at a time.
_SEGMENT_S = 0.005
_MAX_SEGMENT = 16 * 1024


class Direction(enum.Enum):
    UP = "up"  # from the proxied process to its server
    DOWN = "down"  # from the server to the proxied process


@dataclass(frozen=True)
class Toxics:
    """What one direction of a link does to the bytes it carries.

    ``latency_s``: the least one-way delay; ``jitter_s``: a delay drawn uniformly in
    ``[0, jitter_s]`` added to it per chunk; ``bandwidth``: bytes per second, or
    ``None`` for no limit."""

    latency_s: float = 0.0
    jitter_s: float = 0.0
    bandwidth: float | None = None

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.jitter_s < 0:
            raise ValueError("latency and jitter are durations, never negative")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ValueError("a bandwidth limit is a positive number of bytes per second")


@dataclass(frozen=True)
class Release:
    """``size`` bytes, the next ones of the stream, may be written at ``at``."""

    at: float
    size: int


def segment_bytes(bandwidth: float) -> int:
    """The largest piece written at once on a link of ``bandwidth`` bytes/s."""
    return max(1, min(_MAX_SEGMENT, int(bandwidth * _SEGMENT_S)))


class LinkSchedule:
    """The release times of one direction's bytes, in the order they were read."""

    def __init__(self, toxics: Toxics | None = None, rng: random.Random | None = None) -> None:
        self.toxics = toxics or Toxics()
        self._rng = rng or random.Random()
        self._last = float("-inf")  # the latest release handed out so far

    def release(self, now: float, size: int) -> list[Release]:
        """When the ``size`` bytes read at ``now`` may go out: one release, or several
        segments on a link with a bandwidth limit. Times never decrease across calls."""
        if size <= 0:
            return []
        t = self.toxics
        delay = t.latency_s + (self._rng.uniform(0.0, t.jitter_s) if t.jitter_s else 0.0)
        at = max(now + delay, self._last)
        if t.bandwidth is None:
            self._last = at
            return [Release(at, size)]
        # The link sends one segment after the other; each is out when its last byte is.
        seg = segment_bytes(t.bandwidth)
        out: list[Release] = []
        for offset in range(0, size, seg):
            n = min(seg, size - offset)
            at += n / t.bandwidth
            out.append(Release(at, n))
        self._last = at
        return out
