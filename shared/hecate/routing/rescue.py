"""The rescue decision: what a failed dispatch leads to, apart from its bookkeeping.

Pure functions of the failure, the clock and the request's counts. A
:class:`~hecate.routing.lifecycle.Lifecycle` asks :func:`triage` before it looks for
another route and :func:`verdict` once the swarm has offered one; it then carries out
the answer (resend, give up, or move onto the rescue route).
"""

from __future__ import annotations

from dataclasses import dataclass

from hecate.core import Recovered, Unrecoverable
from hecate.core.errors import ErrorCode
from hecate.routing.flow import REQUEST_FAULTS, Failure, FlowOptions
from hecate.routing.reconnect import ReconnectWindow
from hecate.wire.messages import ErrorBody


@dataclass(frozen=True, slots=True)
class ResendSoon:
    """The bus just came back: the node may only not have resubscribed yet, so the same
    stage goes again at ``at`` and nobody is blamed."""

    at: float


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
) -> ResendSoon | GiveUp | None:
    """Before any rescue: a failure that no other route would cure (the request's own
    size), or one the bus's own recovery explains (``window``, at most
    ``opts.reconnect_grace_s``, says whether ``node_id`` may only not be back yet).
    ``None``: look for a rescue."""
    if why.kind == "too_large":
        return GiveUp("payload_too_large", why.reason)
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
) -> GiveUp | Recovered:
    """The rescue the request moves onto, or the error it is answered with: no rescue,
    or its attempt or replay limit reached.
    ``replays`` is ``None`` when no generation has started."""
    if not isinstance(result, Recovered):
        if why.code == "rate_limited" and why.retry_after_s is not None:
            # Nothing else can serve it, and the upstream said when it can: pass it on.
            return GiveUp("rate_limited", why.reason, why.retry_after_s)
        return GiveUp(result.code, result.message)
    loss = f"last loss: {lost_node} ({why.reason})"
    if replays is not None and replays >= opts.max_replays:
        msg = f"migration limit: the generation was already replayed {replays} time(s); {loss}"
        return GiveUp("unrecoverable", msg)
    if attempts >= opts.max_attempts:
        return GiveUp("unrecoverable", f"gave up after {attempts} attempts; {loss}")
    return result


def classify(err: ErrorBody) -> Failure | GiveUp:
    """A node's error reply: the request's own fault, answered as is (no node failed and
    no other route would do better), or a failure of the node to rescue from."""
    if err.code == "no_responders":  # relayed by the node that chained to it
        return Failure("no_responders", "no responders")
    if err.code in REQUEST_FAULTS:
        return GiveUp(err.code, err.message)  # type: ignore[arg-type]
    return Failure("error_reply", f"{err.code}: {err.message}", err.code, err.retry_after_s)
