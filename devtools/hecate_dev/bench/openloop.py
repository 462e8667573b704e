"""An open-loop load generator: requests offered at a fixed rate, whatever the replies do.

A closed loop (N requesters, each waiting for its reply before sending again) slows
down exactly when the system does, and then under-reports latency: the requests it
did not send while waiting never show up as slow ("coordinated omission"). Here
request ``i`` is *scheduled* at ``i / rate`` seconds after the start and sent as soon
as the generator reaches that time; its latency is counted from the scheduled time,
not from when it actually left, so a generator that falls behind charges its own lag
to the figures instead of hiding it. Replies are correlated through one wildcard
inbox, so a late reply never holds back the next send.

Counted honestly, per offered rate:

* ``achieved_rps``: correct replies that arrived within the offered window, per second
  of the window (the rate the system actually served while it was offered the load);
* ``failed``: error replies (or a no-responders status), ``timed_out``: no reply
  within ``timeout_s`` of the scheduled time (a reply later than that is counted
  here too, not as a success);
* ``p50_us`` / ``p99_us``: over **every** request sent, a failed or timed-out one
  counting as ``timeout_s`` (a lower bound of its real cost), so a percentile never
  improves by losing requests; ``p99_capped`` says when p99 is that bound;
* ``send_lag_p99_us``: how late the generator itself sent, the precision of the run.

A path's **capacity** is the highest offered rate it serves in full
(:func:`served_in_full`: at least 99 % of the requests offered answered correctly, and
p99 from the scheduled send within a bound, so a queue that grows through the window
fails it), found by :class:`CapacitySearch`: climb by a fixed factor until two rates in
a row fail, then bisect between the best rate served and the failure above it.

Several generator processes can share one offered rate (:func:`share`: generator ``k``
of ``n`` sends requests ``k, k + n, k + 2n, ...`` of the one schedule), so one
process's limit never passes for the path's; :mod:`hecate_dev.bench.generators` runs them.

The arithmetic (:func:`due`, :func:`share`, :func:`summarize`,
:func:`served_in_full`, :class:`CapacitySearch`) is pure; :func:`offer_share` is the I/O
shell around it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client

SPIN_S = 0.0015  # closer than this to the next send, yield instead of sleeping
OK_SHARE = 0.99  # served in full: at least this share of the offered requests answered ok
P99_BOUND_MS = 100.0  # ... and p99 from the scheduled send within this


def due(elapsed_s: float, rate: float, total: int) -> int:
    """How many of ``total`` requests, scheduled every ``1 / rate`` s from 0, are due
    ``elapsed_s`` after the start (request 0 is due at once)."""
    if elapsed_s < 0:
        return 0
    return min(total, math.floor(elapsed_s * rate + 1e-9) + 1)


def share(total: int, index: int, of: int) -> range:
    """The requests of a ``total``-request schedule that generator ``index`` of ``of``
    sends: every ``of``-th, starting at its own index."""
    return range(index, total, of)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank percentile of an already sorted sequence (0 when empty)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Reply:
    at: float  # seconds from the start
    ok: bool


def summarize(
    rate: float,
    seconds: float,
    timeout_s: float,
    sent_at: Sequence[float],
    replies: dict[int, Reply],
) -> dict[str, Any]:
    """The figures of one offered rate. ``sent_at[i]``: when request ``i`` actually
    left (seconds from the start; it was scheduled at ``i / rate``); ``replies``: the
    first reply per request index."""
    latencies: list[float] = []
    ok = failed = timed_out = served_in_window = 0
    for i in range(len(sent_at)):
        scheduled = i / rate
        reply = replies.get(i)
        if reply is None or reply.at - scheduled > timeout_s:
            timed_out += 1
            latencies.append(timeout_s)
        elif not reply.ok:
            failed += 1
            latencies.append(timeout_s)
        else:
            ok += 1
            latencies.append(reply.at - scheduled)
            served_in_window += reply.at <= seconds
    latencies.sort()
    lags = sorted(max(0.0, at - i / rate) for i, at in enumerate(sent_at))
    p99 = percentile(latencies, 0.99)
    return {
        "offered_rps": round(rate, 1),
        "sent": len(sent_at),
        "ok": ok,
        "failed": failed,
        "timed_out": timed_out,
        "achieved_rps": round(served_in_window / seconds, 1),
        "p50_us": round(percentile(latencies, 0.5) * 1e6, 1),
        "p99_us": round(p99 * 1e6, 1),
        "p99_capped": bool(latencies) and p99 >= timeout_s,
        "send_lag_p99_us": round(percentile(lags, 0.99) * 1e6, 1),
    }


Judge = Callable[[bytes], bool]  # is this reply's payload a correct answer?


async def offer_share(
    nc: Client,
    subject: str,
    body: bytes,
    *,
    rate: float,
    seconds: float,
    timeout_s: float,
    start: float,
    index: int = 0,
    of: int = 1,
    judge: Judge | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[int, float], dict[int, Reply]]:
    """Send this generator's :func:`share` of ``rate`` requests/s for ``seconds``, the
    schedule starting at ``start`` (on ``clock``, which must be the same in every
    generator: ``time.monotonic`` is system-wide on Linux); wait for the stragglers up
    to ``timeout_s`` after the last scheduled send. Returns, by request index, when each
    request left and its first reply (seconds from ``start``). ``judge`` decides whether
    a reply's payload is a success (default: any payload)."""
    prefix = nc.new_inbox()
    replies: dict[int, Reply] = {}
    total = max(1, int(rate * seconds))
    mine = share(total, index, of)
    sent_at: dict[int, float] = {}

    async def on_reply(msg: Any) -> None:
        at = clock() - start
        i = int(msg.subject.rsplit(".", 1)[1])
        if i in replies:
            return
        status = (msg.headers or {}).get("Status")
        good = not status and (judge is None or judge(msg.data))
        replies[i] = Reply(at, good)

    sub = await nc.subscribe(prefix + ".*", cb=on_reply)
    await nc.flush()
    try:
        position = 0  # into ``mine``
        while position < len(mine):
            elapsed = clock() - start
            due_now = due(elapsed, rate, total)
            while position < len(mine) and mine[position] < due_now:
                i = mine[position]
                await nc.publish(subject, body, reply=f"{prefix}.{i}")
                sent_at[i] = clock() - start
                position += 1
            if position == len(mine):
                break
            wait = mine[position] / rate - (clock() - start)
            # The event loop's timers are coarse (about 1 ms): sleep most of the gap,
            # then yield until the send is due, still serving replies meanwhile.
            await asyncio.sleep(wait - SPIN_S if wait > 2 * SPIN_S else 0)
        await nc.flush()
        end = start + (total - 1) / rate + timeout_s
        while len(replies) < len(mine) and clock() < end:
            await asyncio.sleep(0.01)
    finally:
        await sub.unsubscribe()
    return sent_at, dict(replies)


def served_in_full(
    point: dict[str, Any], *, p99_bound_ms: float = P99_BOUND_MS, ok_share: float = OK_SHARE
) -> bool:
    """Whether an offered rate was served in full: at least ``ok_share`` of the requests
    offered answered correctly within the timeout, and p99 (from the scheduled send,
    a failed or lost request counting as the timeout) at most ``p99_bound_ms``. Over a
    window of W seconds, a rate x above capacity builds a queue whose last requests wait
    about x W, so the bound also says how far past capacity a served rate can be."""
    sent = int(point["sent"])
    return sent > 0 and point["ok"] >= ok_share * sent and point["p99_us"] <= p99_bound_ms * 1000


@dataclass
class CapacitySearch:
    """The highest rate served in full, searched without I/O: :meth:`next` says which
    rate to offer, :meth:`record` what came of it.

    First the ``low`` rates (for the latency curve), then a climb from ``start`` by
    ``step`` until ``misses`` rates in a row fail (or ``ceiling`` is passed), then
    geometric bisections between the best rate served and the lowest failed rate above
    it, until they are within ``resolution`` of each other (at most ``refine`` of them):
    a coarse bracket would understate a capacity by up to its width, and by a different
    amount per configuration, which skews their ratio. A failure below a later success
    (a hiccup of a shared machine) does not end the climb by itself; the capacity is the
    highest rate served."""

    start: float
    step: float = 1.25
    misses: int = 2
    refine: int = 2
    resolution: float = 1.0
    low: tuple[float, ...] = ()
    ceiling: float = 1e6
    tried: list[tuple[float, bool]] = field(default_factory=list)
    _queue: list[float] = field(default_factory=list)
    _climb: float = 0.0
    _missed: int = 0
    _refined: int = 0
    _climbing: bool = True

    def __post_init__(self) -> None:
        self._queue = [round(r) for r in self.low]
        self._climb = float(round(self.start))

    @property
    def capacity(self) -> float | None:
        """The highest rate served in full so far (``None``: none was)."""
        return max((r for r, ok in self.tried if ok), default=None)

    @property
    def bounded(self) -> bool:
        """Whether a failed rate lies above the capacity: the search found the limit,
        rather than stopping at its ceiling."""
        best = self.capacity or 0.0
        return any(not ok and r > best for r, ok in self.tried)

    def record(self, rate: float, ok: bool) -> None:
        self.tried.append((rate, ok))
        if self._climbing and rate == self._climb:
            self._missed = 0 if ok else self._missed + 1
            self._climb = float(round(self._climb * self.step))
            if self._missed >= self.misses or self._climb > self.ceiling:
                self._climbing = False

    def next(self) -> float | None:
        """The next rate to offer, or ``None`` when the search is done."""
        if self._queue:
            return float(self._queue.pop(0))
        if self._climbing:
            return self._climb
        if self._refined >= self.refine or not self.bounded:
            return None
        best = self.capacity or 0.0
        above = min(r for r, ok in self.tried if not ok and r > best)
        if best <= 0 or above <= best * self.resolution:
            return None
        middle = float(round(math.sqrt(best * above)))
        if middle in (best, above) or any(r == middle for r, _ in self.tried):
            return None
        self._refined += 1
        return middle
