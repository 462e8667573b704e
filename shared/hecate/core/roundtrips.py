"""What a router measured itself: how long a step along each pipeline took, recently.

Telemetry knows what each node computes (``latency_n``, timed inside the node). It does
not know what the router waits for: a stage's request and reply cross the node's link,
and a node 40 ms away costs 40 ms a stage whatever it computes. The router times every
step it dispatches (one pass, or one decode step of a generation, on a request's first
route), and this module keeps, per pipeline, the least of those times over a short
window. The cost model (:func:`hecate.core.cost.link_cost`) takes it for the pipeline's
latency in place of what its nodes report.

The rules:

* **The least, not an average.** A busy pipeline's steps wait in queues, and that wait
  is already counted by the load term (telemetry's load and this router's in-flight
  work). The least step of a window is the one that queued least: what the links and
  the compute cost on their own. So load is not counted twice, and a pipeline that was
  busy a moment ago is not shunned after the load has gone. Only a pipeline that queued
  on every step for a whole window shows its queueing here too.
* **Recent only.** Samples fall in windows of ``window_s``; the figure is the least of
  the current window and the one before. A pipeline with no step for a window or two
  has no figure at all: what it was is forgotten, never held against it (a link that
  healed is tried again), and a link or node that got slower shows within two windows
  (2 s each by default: short, because a measured pipeline's latency is this figure
  alone, and a node that slowed down must not keep its traffic for long).
* **Unmeasured is penalised, never ignored**, by the cost model's fixed allowance
  (:attr:`hecate.core.cost.ColdPenalty.link_ms`), not by anything kept here; and so
  that a pipeline charged it is ever measured again, the router sends a bounded share
  of requests to the cheapest unmeasured one that could win
  (:meth:`hecate.core.router.Router.explore`).
* **Plan pipelines only.** A route that is not one (a splice, named ``<id>~splice``) is
  not a pipeline the router can choose again; the caller passes only plan pipelines.

No clock: every call is given the time, and times must not go backwards per pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

DEFAULT_WINDOW_S = 2.0


@dataclass(slots=True)
class _Window:
    start: float  # when the current window began
    least_ms: float  # the least step of the current window
    before_ms: float | None  # the least step of the window before, if it was the last one


class RoundTrips:
    """The least step round trip of each pipeline over its last window or two."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        if window_s <= 0:
            raise ValueError("need window_s > 0")
        self.window_s = window_s
        self._windows: dict[str, _Window] = {}

    def sample(self, pipeline_id: str, ms: float, now: float) -> None:
        """A step along ``pipeline_id`` took ``ms`` milliseconds, ending at ``now``."""
        if not ms >= 0:  # a negative or NaN time is a clock fault, not a measurement
            return
        w = self._windows.get(pipeline_id)
        if w is None or now >= w.start + 2 * self.window_s:
            self._windows[pipeline_id] = _Window(now, ms, None)
        elif now >= w.start + self.window_s:
            w.start, w.before_ms, w.least_ms = now, w.least_ms, ms
        else:
            w.least_ms = min(w.least_ms, ms)

    def least_ms(self, pipeline_id: str, now: float) -> float | None:
        """The least step measured on ``pipeline_id`` lately, or None: never measured,
        or not for a window or two (forgotten)."""
        return self.lately(pipeline_id, now)[0]

    def lately(self, pipeline_id: str, now: float) -> tuple[float | None, float]:
        """:meth:`least_ms` at ``now``, and until when it stays so if no sample of
        ``pipeline_id`` comes (a window closing, or the figure being forgotten): what a
        caller may keep instead of asking again at every decision."""
        w = self._windows.get(pipeline_id)
        if w is None:
            return None, math.inf
        # Against the instants themselves, not the age: ``now - start`` may round below
        # a boundary that ``now`` has reached, and a caller keeping the figure until
        # the instant returned would then disagree with this answer.
        if now >= w.start + 2 * self.window_s:
            return None, math.inf
        if now >= w.start + self.window_s or w.before_ms is None:
            return w.least_ms, w.start + 2 * self.window_s
        return min(w.least_ms, w.before_ms), w.start + self.window_s

    def forget(self, now: float) -> None:
        """Drop what is forgotten anyway (keeps the table to pipelines in use)."""
        for pid in [p for p, w in self._windows.items() if now >= w.start + 2 * self.window_s]:
            del self._windows[pid]

    def keep(self, pipeline_ids: Collection[str]) -> None:
        """Keep only these pipelines' figures (a new plan: a pipeline that is gone, or
        that now names other nodes, was measured on links it no longer has)."""
        for pid in [p for p in self._windows if p not in pipeline_ids]:
            del self._windows[pid]

    def __len__(self) -> int:
        return len(self._windows)

    def __contains__(self, pipeline_id: object) -> bool:
        return pipeline_id in self._windows
