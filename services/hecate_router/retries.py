"""Idempotent retries and cancels at a router's desk: a client's retry (same tenant and
request_id) never runs twice, and a cancel finds its request wherever it is.

Functions over the :class:`~hecate_router.desk.RouterDesk` (as
:mod:`hecate_router.losses` is over a lifecycle): pure, no I/O. On the replica that has
it, a retry joins the running request or gets the remembered answer again
(:class:`RetryBook`); a retry that may be another replica's is claimed first (the desk
asks every replica on ``hecate.router.retries`` and runs it only if none owns it in
time). The first attempt of a request pays nothing for any of this, except just after
this replica was frozen (GC, swap, SIGSTOP): what waited in its socket meanwhile may
have been hedged to, and run by, another replica (client/hedge.py), so for a moment
every request is asked about like a retry before it runs.

A joined retry is held until its flight lands: a flight holds at most
``max_joined_retries`` of them, those that reached this replica and those another
replica handed over together, and one more is answered ``rate_limited`` at once (it is
not run either: the request already runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from hecate.wire.errors import error_headers
from hecate_router import desk_flow as d
from hecate_router import flow
from hecate_router.retrybook import Answered, Ident, Running

if TYPE_CHECKING:
    from hecate_router.desk import RouterDesk

REMEMBER_CANCELS = 4096  # cancels of requests not (yet) in flight here
# A gap this long between two looks at the clock means the process stood still. Below
# the client's hedge floor (client/hedge.py FLOOR_S): a request that waited long enough
# to be hedged waited long enough to be doubted.
STALL_S = 0.2
DOUBT_S = 0.5  # how long after waking every request is asked about first
# A retry turned away from a full flight is told to come back soon: once the flight
# lands its answer is remembered, and sent again at no cost.
JOIN_FULL_RETRY_S = 1.0

_json = msgspec.json.Encoder()
Caller = int | str  # a call that reached this replica, or another replica's caller


def doubted(desk: RouterDesk, now: float) -> bool:
    """Whether a first attempt arriving now may have run elsewhere meanwhile."""
    clock(desk, now)
    return now < desk.doubt_until


def clock(desk: RouterDesk, now: float) -> None:
    """The desk is told the time: a long gap since the last time is a stall."""
    if desk.awake is not None and now - desk.awake > STALL_S:
        desk.counters["stalls"] += 1
        desk.doubt_until = now + DOUBT_S
    desk.awake = now if desk.awake is None else max(desk.awake, now)


def repeat(desk: RouterDesk, ident: Ident, caller: Caller, out: list[d.Action]) -> bool:
    """Join the running request (or say it holds enough retries already) or repeat
    its answer; False if it is not ours."""
    match desk.book.lookup(ident):
        case Running(key) if (flight := desk.flights.get(key)) is not None:
            waiting = len(flight.joined) + len(flight.machine.also_reply_to)
            if waiting >= desk.config.max_joined_retries:
                desk.counters["retries_refused_full"] += 1
                _refuse_full(ident, caller, waiting, flight.machine.model_id, out)
            elif isinstance(caller, int):
                flight.joined.append(caller)
                desk.counters["retries_joined"] += 1
            else:  # another replica's caller: the machine answers it too
                flight.machine.handle(flow.RetryJoined(caller))
                desk.counters["retries_joined"] += 1
            return True
        case Answered((body, headers)):
            desk.counters["retries_answered_again"] += 1
            if isinstance(caller, int):
                out.append(d.Respond((caller,), None, body, headers))
            elif caller:
                out.append(d.Respond((), None, body, headers, to=(caller,)))
            return True
    return False


def _refuse_full(
    ident: Ident, caller: Caller, waiting: int, model_id: str, out: list[d.Action]
) -> None:
    """The flight holds as many retries as it may: this one is told so, and when to
    come back, rather than held too."""
    retry = JOIN_FULL_RETRY_S
    why = f"{waiting} retries of this request already wait for its answer; retry in {retry:.1f} s"
    reply = d.refusal(model_id, ident[1], "rate_limited", why, retry)
    if isinstance(caller, int):
        out.append(d.Respond((caller,), reply))
    elif caller:  # another replica's retry: its client waits on this subject
        headers = error_headers("rate_limited", why, retry)
        out.append(d.Respond((), reply, _json.encode(reply), headers, to=(caller,)))


def cancel(desk: RouterDesk, ident: Ident, now: float, out: list[d.Action]) -> None:
    """A caller gave up: its flight, if it runs here, is answered ``cancelled`` now
    and its nodes drop the session; else the cancel is remembered."""
    key = desk.book.in_progress.get(ident)
    if key is not None and key in desk.flights:
        return desk.feed_flight(key, flow.Cancelled(now), out)
    desk.cancels[ident] = None
    while len(desk.cancels) > REMEMBER_CANCELS:
        desk.cancels.popitem(last=False)
    return None
