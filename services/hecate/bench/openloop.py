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

The arithmetic (:func:`due`, :func:`ladder`, :func:`summarize`) is pure; :func:`offer`
is the I/O shell around it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nats

SPIN_S = 0.0015  # closer than this to the next send, yield instead of sleeping


def due(elapsed_s: float, rate: float, total: int) -> int:
    """How many of ``total`` requests, scheduled every ``1 / rate`` s from 0, are due
    ``elapsed_s`` after the start (request 0 is due at once)."""
    if elapsed_s < 0:
        return 0
    return min(total, math.floor(elapsed_s * rate + 1e-9) + 1)


def ladder(capacity_rps: float, fractions: Sequence[float]) -> list[float]:
    """Offered rates as fractions of a measured capacity, rounded to whole requests/s
    (at least 1)."""
    return [float(max(1, round(capacity_rps * f))) for f in fractions]


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


async def offer(
    url: str,
    subject: str,
    body: bytes,
    *,
    rate: float,
    seconds: float,
    timeout_s: float = 2.0,
    judge: Judge | None = None,
) -> dict[str, Any]:
    """Offer ``rate`` requests/s to ``subject`` for ``seconds``; wait for the stragglers
    up to ``timeout_s`` after the last scheduled send; return :func:`summarize`'s
    figures. ``judge`` decides whether a reply is a success (default: any payload)."""
    nc = await nats.connect(url)
    prefix = nc.new_inbox()
    replies: dict[int, Reply] = {}
    total = max(1, int(rate * seconds))
    sent_at: list[float] = []
    clock = time.perf_counter
    start = clock() + 0.01

    async def on_reply(msg: Any) -> None:
        at = clock() - start
        index = int(msg.subject.rsplit(".", 1)[1])
        if index in replies:
            return
        status = (msg.headers or {}).get("Status")
        good = not status and (judge is None or judge(msg.data))
        replies[index] = Reply(at, good)

    sub = await nc.subscribe(prefix + ".*", cb=on_reply)
    await nc.flush()
    try:
        while len(sent_at) < total:
            elapsed = clock() - start
            for i in range(len(sent_at), due(elapsed, rate, total)):
                await nc.publish(subject, body, reply=f"{prefix}.{i}")
                sent_at.append(clock() - start)
            wait = len(sent_at) / rate - (clock() - start)
            # The event loop's timers are coarse (about 1 ms): sleep most of the gap,
            # then yield until the send is due, still serving replies meanwhile.
            await asyncio.sleep(wait - SPIN_S if wait > 2 * SPIN_S else 0)
        await nc.flush()
        end = start + (total - 1) / rate + timeout_s
        while len(replies) < total and clock() < end:
            await asyncio.sleep(0.01)
    finally:
        await sub.unsubscribe()
        await nc.close()
    return summarize(rate, seconds, timeout_s, sent_at, dict(replies))
