"""What a failed dispatch does to a request in flight: resend it, reroute it, hold it
for a route to come back, or answer it. The failure half of
:class:`~hecate_router.lifecycle.Lifecycle`, as functions over it: they change its
state only through its table (``lc._to``), like its own methods.

One failure goes: :func:`~hecate_router.hearing.isolated` (is it the router's own link?)
and :func:`~hecate_router.rescue.triage` (resend soon, or give up at once), else the
router's view is asked for a rescue route; none after a silence holds the request
(:func:`look_again` asks again), and :func:`~hecate_router.rescue.verdict` says whether
a rescue is taken (:func:`_move`) or the request is answered.

**Waiting for a route.** When a node went *silent* (a stage timed out, telemetry called
it down, nobody listens on its subject) and no route is left, the swarm may be cut in
two by a partition that heals in seconds, not dead: nodes that fall silent together
are far more often behind one failed link or server than dead at once. The request is
held, for at most ``route_wait_s``, and the rescue is asked again every
``resend_delay_s``; the first route that comes back takes it, as a failover (an attempt,
so a flight waits afresh at most ``max_attempts`` times), and only a wait that ends with
none is ``unrecoverable``. A node that answered with an error, or a router that hears
nobody (its own isolation: ``hecate_router.hearing``), is not waited for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hecate.core import Recovered, RoutingRequest, Unrecoverable
from hecate.wire.messages import Failover
from hecate_router.flow import (
    Action,
    Failure,
    Move,
    Release,
    Report,
    Suspect,
)
from hecate_router.hearing import isolated
from hecate_router.rescue import GiveUp, ResendSoon, triage, verdict
from hecate_router.states import State

if TYPE_CHECKING:
    from hecate_router.lifecycle import Lifecycle

S = State


# What a node's silence looks like (flow.Failure.kind): the failures a route may come
# back from while the request waits.
SILENCES = frozenset({"timeout", "node_down", "no_responders"})


@dataclass(frozen=True, slots=True)
class Held:
    """Why a request waits for a route, and since when."""

    node_id: str
    why: Failure
    since: float


def failed(lc: Lifecycle, node_id: str, why: Failure, now: float, out: list[Action]) -> None:
    """The current dispatch failed on ``node_id``: resend, reroute or answer."""
    lc.send = 0
    opts = lc.options
    window, stage = lc.reconnect, lc.stage
    cut_off = isolated(
        why,
        lc.hearing,
        reconnected_at=window.at,
        sent=lc.sent_at,
        now=now,
        quiet_s=opts.deaf_after_s,
    )
    first = triage(
        why,
        now,
        node_id=node_id,
        window=window,
        stage=stage,
        opts=opts,
        isolated=cut_off,
        excused_since=lc.excused_since,
    )
    if isinstance(first, ResendSoon):
        if first.isolated:  # the router's own link: not an attempt, nobody's fault
            lc.counters["resent_isolated"] += 1
            if lc.excused_since is None:
                lc.excused_since = now
        else:
            lc.counters["resent_after_reconnect"] += 1
        lc._to(S.RESENDING)
        lc.resend_at = first.at
        lc.resent = True
        return None
    if first is not None:
        return lc._give_up(first, out)
    if not why.silent:  # errors and slowness are the breaker's; liveness, telemetry's
        lc._report(Report(node_id, False, why.breaker_code, why.retry_after_s), out)
    out.append(Suspect(node_id))
    result = lc.routes.rescue(lc.route, node_id, RoutingRequest(tokens=lc.request.max_tokens))
    waits = opts.route_wait_s > 0 and why.kind in SILENCES and not cut_off
    if isinstance(result, Recovered) or not waits:
        return _rescued(lc, node_id, why, result, now, out, cut_off)
    # No route after a silence (not an error a node answered), and the router not
    # cut off itself: wait for one. (A waiting request leaves WAITING only onto a
    # route or with its answer, so no wait is under way here.)
    lc.held = Held(node_id, why, now)
    lc.counters["held_for_route"] += 1
    lc._to(S.WAITING)
    _look_at(lc, now)
    return None


def _look_at(lc: Lifecycle, now: float) -> None:
    """Ask for a route again after ``resend_delay_s``, or when the wait runs out."""
    assert lc.held is not None
    wait_ends = lc.held.since + lc.options.route_wait_s
    lc.resend_at = min(now + lc.options.resend_delay_s, wait_ends)


def look_again(lc: Lifecycle, now: float, out: list[Action]) -> None:
    """Waiting: a route back (any node of the request's route that the router's
    view calls alive again is taken as it is) moves the request onto it; none when
    the wait has run out answers it."""
    held = lc.held
    assert held is not None
    result = lc.routes.rescue(lc.route, "", RoutingRequest(tokens=lc.request.max_tokens))
    waited = now - held.since
    if isinstance(result, Recovered) or waited >= lc.options.route_wait_s:
        lc.held = None
        lc.counters["route_came_back" if isinstance(result, Recovered) else "waited_out"] += 1
        why = Failure(
            held.why.kind,
            f"{held.why.reason}; held {waited:.1f} s for a route",
            held.why.code,
            held.why.retry_after_s,
        )
        return _rescued(lc, held.node_id, why, result, now, out, None, waited)
    _look_at(lc, now)
    return None


def _rescued(
    lc: Lifecycle,
    node_id: str,
    why: Failure,
    result: Recovered | Unrecoverable,
    now: float,
    out: list[Action],
    cut_off: str | None,
    waited: float | None = None,
) -> None:
    """Tell the swarm how the loss of ``node_id`` ended (``waited``: after so long
    waiting for a route), then move or answer."""
    opts = lc.options
    old = lc.route
    kind = result.kind if isinstance(result, Recovered) else "unrecoverable"
    lc.counters["failovers"] += 1
    lc.counters[f"failover_{kind}"] += 1
    new = result.route if isinstance(result, Recovered) else None
    out.append(
        Failover(
            request_id=lc.request_id,
            model_id=lc.model_id,
            lost_node=node_id,
            kind=kind,
            old_route=old,
            new_route=new,
            attempt=lc.attempts,
            reason=why.reason,
        )
    )
    replays = lc.gen.replays if lc.gen.started else None
    rescue = verdict(
        result,
        why,
        node_id,
        attempts=lc.attempts,
        replays=replays,
        opts=opts,
        isolated=cut_off,
    )
    if isinstance(rescue, GiveUp):
        if waited is not None and not isinstance(result, Recovered):
            late = f"{rescue.message}; no route came back within {waited:.1f} s"
            rescue = GiveUp(rescue.code, late, rescue.retry_after_s)
        return lc._give_up(rescue, out)
    return _move(lc, rescue, now, out)


def prefix_lost(lc: Lifecycle, now: float, out: list[Action]) -> None:
    """A stage no longer keeps the cached prefix the first stage started from (it
    evicted it, or restarted): nobody failed. The step starts over on the same route in
    a fresh session (the stages before hold a part of this one), every position
    computed."""
    lc.counters["prefix_lost"] += 1
    lc.gen.without_prefix()
    if lc.routes.keeps_sessions(lc.route.model_id):
        out.append(Release(lc.route, lc.session))
    lc.session = f"{lc.flight_id}.{lc.attempts}.whole"
    lc.stage = 0
    lc.acts = {0: b""}
    lc._dispatch(now, out)


def _move(lc: Lifecycle, rescue: Recovered, now: float, out: list[Action]) -> None:
    """Carry the request onto the rescue route and send its next stage there."""
    old = lc.route
    lc.attempts += 1
    lc.counters["retries"] += 1
    if rescue.route.model_id != old.model_id:  # a reserve model starts from its prompt
        lc.acts = {0: b""}
    lc.degraded = lc.degraded or rescue.degraded
    out.append(Move(old, rescue.route))
    lc.route = rescue.route
    # The rescue route spends any probe lease held for a target on it, as a first
    # route does; a probe for a target it leaves out is given back.
    kept = {t for t in lc.probes if t in rescue.route.node_ids}
    lc.routes.give_back(lc.probes - kept)
    lc.probes = kept | lc.routes.take(rescue.route)
    # A fresh session per attempt: caches a dead route left half-built are never mixed.
    if lc.routes.keeps_sessions(old.model_id):
        out.append(Release(old, lc.session))
    lc.session = f"{lc.flight_id}.{lc.attempts}"
    if lc.gen.started:
        # Generation: the rescue route's caches are empty; replay the prompt and every
        # token so far (the sampled ones as decode steps), then carry on where the
        # stream was.
        lc.counters["replays"] += 1
        lc.gen.replay()
        lc.acts = {0: b""}
    # Resume at the last stage whose input we already hold (layer 0 = the prompt).
    lc.stage = max(i for i, s in enumerate(lc.route.stages) if s.layer_start in lc.acts)
    lc._dispatch(now, out)
