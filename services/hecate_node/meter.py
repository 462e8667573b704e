"""What a node measures of its own work: the one place its compute is timed and counted.

Every figure a heartbeat and ``$SRV.STATS`` report comes from here: steps in flight,
busy time since the last beat, and the stage latency (none until a range has really
run here, then an average of what the stages, batches and warm-up passes took). A stage
served one at a time is recorded per stage, a generation step per batch (the batch is
the unit of work; queueing behind one is load, reported as in flight, not speed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from hecate.core.telemetry import ewma

#: The weight of the newest sample in the latency average.
ALPHA = 0.3
#: The fewest positions a batch runs for its time to measure what a position costs
#: (fewer: its time is the batch's own overhead, not its positions').
PREFILL_POSITIONS = 64


def timed(run: Callable[[str, int, int], None], holding: tuple[str, int, int]) -> int:
    """Nanoseconds ``run`` takes on a (model, start, end) holding, timed in the thread
    that runs it, so that a hand-off to a worker thread is not counted as compute."""
    started = time.perf_counter_ns()
    run(*holding)
    return time.perf_counter_ns() - started


async def slow_down(delay_ms: float) -> None:
    """Wait at least ``delay_ms`` (an injected fault), awaited inside the stage timer:
    telemetry must see the node exactly as it would see one whose hardware is that slow
    (measured latency, busy time and work in flight all rise), or load would never
    move off it."""
    if not delay_ms:
        return
    # uvloop's timers run on a millisecond clock read once per loop turn, so a single
    # sleep can end up to a millisecond early; the fault promises at least the delay.
    deadline = time.perf_counter() + delay_ms / 1000
    while (left := deadline - time.perf_counter()) > 0:
        await asyncio.sleep(left)


class StageMeter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.in_flight = 0
        self.latency_ms: float | None = None
        self.busy_ns = 0
        self.worked_at = 0.0  # clock time of the last stage really served
        self.batches = self.batched_steps = self.largest_batch = 0
        # What a prompt position costs a layer here, in ms (prefill batches; None until one)
        self.prefill_ms: float | None = None

    def stage(self, spent_ns: int, ok: bool) -> None:
        """A stage served on its own took ``spent_ns``: busy either way, a latency
        sample if it succeeded."""
        self.busy_ns += spent_ns
        if ok:
            self._sample(spent_ns)

    def batch(self, spent_ns: int, steps: int, positions: int = 0, layers: int = 0) -> None:
        """A batch of ``steps`` generation steps took ``spent_ns``: one sample per batch,
        what each of its steps waited for this stage to compute it. A batch that ran at
        least :data:`PREFILL_POSITIONS` ``positions`` through ``layers`` layers is also a
        sample of what a prompt position costs a layer (:attr:`prefill_ms`)."""
        if positions >= PREFILL_POSITIONS and layers > 0:
            per = spent_ns / 1e6 / (positions * layers)
            self.prefill_ms = ewma(self.prefill_ms, per, ALPHA)
        self.batches += 1
        self.batched_steps += steps
        self.largest_batch = max(self.largest_batch, steps)
        self.busy_ns += spent_ns
        self._sample(spent_ns)

    def warmed(self, spent_ns: int) -> None:
        """A warm-up pass on adopting a range: averaged in, but not traffic."""
        self.busy_ns += spent_ns
        self.latency_ms = ewma(self.latency_ms, spent_ns / 1e6, ALPHA)

    def remeasured(self, spent_ns: int) -> None:
        """A pass of an idle node: it replaces the old figure, being what a stage takes now."""
        self.busy_ns += spent_ns
        self.latency_ms = spent_ns / 1e6

    def idle(self, for_s: float) -> bool:
        """Whether no stage was served in the last ``for_s`` seconds."""
        return self.clock() - self.worked_at >= for_s

    def take_busy(self) -> int:
        """The busy nanoseconds since the last call (one heartbeat's worth)."""
        busy, self.busy_ns = self.busy_ns, 0
        return busy

    def _sample(self, spent_ns: int) -> None:
        self.latency_ms = ewma(self.latency_ms, spent_ns / 1e6, ALPHA)
        self.worked_at = self.clock()
