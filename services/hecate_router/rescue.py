"""The rescue decision: what a failed dispatch leads to, apart from its bookkeeping.

Pure functions of the failure, the clock and the request's counts. A
:class:`~hecate_router.lifecycle.Lifecycle` asks :func:`triage` before it looks for
another route and :func:`verdict` once the swarm has offered one; it then carries out
the answer (resend, give up, or move onto the rescue route).
"""

from __future__ import annotations

from dataclasses import dataclass

from hecate.core import Recovered, Unrecoverable
from hecate.core.errors import ErrorCode
from hecate.wire.messages import ErrorBody
from hecate_router.flow import REQUEST_FAULTS, Failure, FlowOptions
from hecate_router.reconnect import ReconnectWindow


@dataclass(frozen=True, slots=True)
class ResendSoon:
    """The same stage goes again at ``at`` and nobody is blamed: the bus just came back
    and the node may only not have resubscribed yet, or (``isolated`` says why) the
    router's own link lost it (see :mod:`hecate_router.hearing`)."""

    at: float
    isolated: str = ""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Answer the caller with this error; no other route is tried."""

    code: ErrorCode
    message: str
    retry_after_s: float | None = None


def triage(
    why: Failure,
    now: float,
    *,
    node_id: str,
    window: ReconnectWindow,
    stage: int,
    opts: FlowOptions,
    isolated: str | None = None,
    excused_since: float | None = None,
) -> ResendSoon | GiveUp | None:
    """Before any rescue: a failure that no other route would cure (the request's own
    size, or data no stage message can carry), one the router's own isolation explains
    (``isolated``: why, from :func:`hecate_router.hearing.isolated`; excused until
    ``opts.isolation_limit_s`` after ``excused_since``, the flight's first excused
    failure), or one the bus's own
    recovery explains (``window``, at most ``opts.reconnect_grace_s``, says whether
    ``node_id`` may only not be back yet). ``None``: look for a rescue."""
    if why.kind == "too_large":
        return GiveUp("payload_too_large", why.reason)
    if why.kind == "unsendable":
        return GiveUp("bad_request", why.reason)
    if isolated and (excused_since is None or now - excused_since < opts.isolation_limit_s):
        return ResendSoon(now + opts.resend_delay_s, isolated)
    # In a chain only when its first stage was missing: later ones already ran.
    if (
        why.kind == "no_responders"
        and window.forgives(node_id, now, opts.reconnect_grace_s)
        and (not opts.chain or stage == 0)
    ):
        return ResendSoon(now + opts.resend_delay_s)
    return None


def verdict(
    result: Recovered | Unrecoverable,
    why: Failure,
    lost_node: str,
    *,
    attempts: int,
    replays: int | None,
    opts: FlowOptions,
    isolated: str | None = None,
) -> GiveUp | Recovered:
    """The rescue the request moves onto, or the error it is answered with: no rescue,
    or its attempt or replay limit reached.
    ``replays`` is ``None`` when no generation has started. ``isolated``: why the router
    itself may be cut off (its excuse ran out): then no answer says a node was lost."""
    if not isinstance(result, Recovered):
        if why.code == "rate_limited" and why.retry_after_s is not None:
            # Nothing else can serve it, and the upstream said when it can: pass it on.
            return GiveUp("rate_limited", why.reason, why.retry_after_s)
        return _cut_off(isolated) or GiveUp(result.code, result.message)
    loss = f"last loss: {lost_node} ({why.reason})"
    if replays is not None and replays >= opts.max_replays:
        msg = f"migration limit: the generation was already replayed {replays} time(s); {loss}"
        return _cut_off(isolated) or GiveUp("unrecoverable", msg)
    if attempts >= opts.max_attempts:
        gave_up = f"gave up after {attempts} attempts; {loss}"
        return _cut_off(isolated) or GiveUp("unrecoverable", gave_up)
    return result


def _cut_off(isolated: str | None) -> GiveUp | None:
    """The answer of a router that ran out of routes while it hears nobody: the swarm
    may be fine, the router is what is cut off, and a retry through another router
    (which a client does on ``timeout``) is what helps."""
    if not isolated:
        return None
    msg = f"this router is cut off from the swarm: {isolated}; retry through another router"
    return GiveUp("timeout", msg)


def classify(err: ErrorBody) -> Failure | GiveUp:
    """A node's error reply: the request's own fault, answered as is (no node failed and
    no other route would do better), or a failure of the node to rescue from."""
    if err.code == "no_responders":  # relayed by the node that chained to it
        return Failure("no_responders", "no responders")
    if err.code in REQUEST_FAULTS:
        return GiveUp(err.code, err.message)  # type: ignore[arg-type]
    return Failure("error_reply", f"{err.code}: {err.message}", err.code, err.retry_after_s)
