"""What reaches a router, and what it does about it: the events fed to its
:class:`~hecate_router.desk.RouterDesk` and the actions the desk answers with.

No I/O here and no clock: every event that needs the time carries it. Requests are
named by integers the router process gives them as they arrive (``call``); a flight is
named by the call that started it, so a stage reply's subject carries the number and
nothing a caller chose. The process keeps the bus's handle of each call and answers it
when an action says so.

A flight's own events and actions (a stage's reply, a resend, a failover) are
:mod:`hecate_router.flow`'s: the desk hands them to the flight's
:class:`~hecate_router.lifecycle.Lifecycle` and turns what it answers into the actions
below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hecate.core.errors import ErrorCode
from hecate.core.plan import Stage
from hecate.wire.messages import (
    ErrorBody,
    ErrorReply,
    Failover,
    InferReply,
    InferRequest,
    QuotaReply,
    QuotaRequest,
    RetryClaim,
    StageReply,
    StreamToken,
    TelemetrySnapshot,
)
from hecate_router.flow import Failure, NodeDown, Release, Report, Send, Tick

# -- events -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrived:
    """A request on ``hecate.infer.<model_id>`` (or ``hecate.stream.``), its tenant and
    streaming already settled from what the bus vouches for. ``reply_to``: where its
    caller waits ("" when it waits nowhere)."""

    call: int
    model_id: str
    request: InferRequest
    reply_to: str
    now: float


@dataclass(frozen=True, slots=True)
class Claimed:
    """Another replica holds a retry of ``(tenant, request_id)`` and asks who owns it;
    its caller waits on ``reply_to``."""

    tenant: str
    request_id: str
    reply_to: str


@dataclass(frozen=True, slots=True)
class HandedOver:
    """The owner of claim ``claim`` answered its caller itself."""

    claim: int


@dataclass(frozen=True, slots=True)
class QuotaAnswered:
    """The quota desk's answer for ``call``; None: no responders, unreadable, or the ask
    never left."""

    call: int
    reply: QuotaReply | None
    now: float


@dataclass(frozen=True, slots=True)
class StageHeard:
    """What came back for stage ``stage`` of send ``send`` of flight ``flight``: a reply,
    a refusal, or a failure the process saw itself (no responders, unreadable, the
    publish failed)."""

    flight: int
    send: int
    stage: int
    outcome: StageReply | ErrorReply | Failure
    now: float

    def answerer(self, current: int, stages: Sequence[Stage]) -> str | None:
        """The node a reply on the ``current`` send's stage subject comes from: that
        stage's, except for a no-responders a chained node relays for the next one."""
        reply = self.outcome
        if isinstance(reply, ErrorReply) and reply.error.code == "no_responders":
            return None
        if self.send == current and self.stage < len(stages):
            return stages[self.stage].node_id
        return None


@dataclass(frozen=True, slots=True)
class Cancel:
    tenant: str
    request_id: str
    now: float


@dataclass(frozen=True, slots=True)
class Reconnected:
    """The router's connection came back at ``at`` (monotonic); ``wall`` is the wall
    clock at ``now``, to read telemetry's times against."""

    at: float
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class TelemetryHeard:
    """A telemetry snapshot came in over the router's link at ``now`` (``wall``)."""

    snapshot: TelemetrySnapshot
    now: float
    wall: float


@dataclass(frozen=True, slots=True)
class Drain:
    """The router stops taking requests: the line is answered ``draining``."""

    now: float


@dataclass(frozen=True, slots=True)
class Stop:
    """The router stops: every flight still in the air is answered ``draining``."""

    now: float


Event = (
    Arrived
    | Claimed
    | HandedOver
    | QuotaAnswered
    | StageHeard
    | NodeDown
    | Cancel
    | Reconnected
    | TelemetryHeard
    | Tick
    | Drain
    | Stop
)

# -- actions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Publish ``send`` for flight ``flight`` (its reply subject names the flight, the
    send and the stage); ``attempt`` is the route it is on, the first being 1."""

    flight: int
    attempt: int
    send: Send


@dataclass(frozen=True, slots=True)
class Streamed:
    """A token for ``call``'s caller, on its own reply subject, before its answer."""

    call: int
    token: StreamToken


@dataclass(frozen=True, slots=True)
class FailedOver:
    """Flight ``flight`` left a node: publish it (stamped with the router and the time)."""

    flight: int
    failover: Failover


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer ``calls`` and publish to ``to`` (other replicas' callers).

    ``reply``: the answer as a struct, None for one remembered as bytes. ``body`` and
    ``headers``: the same encoded, when it goes out as bytes (b"" otherwise: a call is
    then answered from ``reply``)."""

    calls: tuple[int, ...]
    reply: InferReply | None
    body: bytes = b""
    headers: dict[str, str] | None = None
    to: tuple[str, ...] = ()


def refusal(
    model_id: str,
    request_id: str,
    code: ErrorCode,
    message: str,
    retry_after_s: float | None = None,
    ticket: int | None = None,
) -> InferReply:
    """A request's answer when it does not run (or no longer may)."""
    return InferReply(
        ok=False,
        error=ErrorBody(code=code, message=message, retry_after_s=retry_after_s),
        model_id=model_id,
        request_id=request_id,
        retry_after_s=retry_after_s,
        quota_ticket=ticket,
    )


@dataclass(frozen=True, slots=True)
class AskQuota:
    call: int
    ask: QuotaRequest


@dataclass(frozen=True, slots=True)
class AskOwner:
    """Ask every replica whether one owns this retry; answers name ``claim``."""

    claim: int
    ask: RetryClaim


@dataclass(frozen=True, slots=True)
class Forget:
    """``call`` is another replica's to answer: its handle is let go, unanswered."""

    call: int


@dataclass(frozen=True, slots=True)
class OwnRetry:
    """A :class:`Claimed` retry is this replica's: say so to the replica that asked."""


Action = (
    Dispatch
    | Streamed
    | FailedOver
    | Report
    | Release
    | Respond
    | AskQuota
    | AskOwner
    | Forget
    | OwnRetry
)

__all__ = [
    "Action",
    "Arrived",
    "AskOwner",
    "AskQuota",
    "Cancel",
    "Claimed",
    "Dispatch",
    "Drain",
    "Event",
    "FailedOver",
    "Forget",
    "HandedOver",
    "NodeDown",
    "OwnRetry",
    "QuotaAnswered",
    "Reconnected",
    "Release",
    "Report",
    "Respond",
    "StageHeard",
    "Stop",
    "Streamed",
    "TelemetryHeard",
    "Tick",
    "refusal",
]
