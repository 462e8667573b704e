"""What happens to a request in flight, and what the router does about it: the events
fed to a :class:`~hecate_router.lifecycle.Lifecycle` and the actions it answers with.

No I/O here and no clock: every event that needs the time carries it. The router
service turns what it hears on the bus into events and runs the actions; the tests feed
events straight in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from hecate.core import Recovered, Route, RoutingRequest, Unrecoverable
from hecate.core.errors import ErrorCode
from hecate.model.executor import ExecutorKind
from hecate.wire.messages import (
    ErrorReply,
    Failover,
    InferReply,
    StageReply,
    StageRequest,
    StreamToken,
)

# -- what the machine needs to know of the swarm ------------------------------------------


class Routes(Protocol):
    """The router's view of the swarm, as far as one request needs it."""

    @property
    def epoch(self) -> int: ...

    def layers(self, model_id: str) -> int: ...

    def executor_kind(self, model_id: str) -> ExecutorKind:
        """What executes the model's stages, so which stage message they take."""
        ...

    def keeps_sessions(self, model_id: str) -> bool:
        """Whether the model's nodes hold per-session caches to release."""
        ...

    def rescue(
        self, route: Route, lost_node: str, request: RoutingRequest
    ) -> Recovered | Unrecoverable: ...

    def take(self, route: Route) -> set[str]:
        """Spend the probe leases held for targets on ``route``: their probes ride here."""
        ...

    def give_back(self, probes: set[str]) -> None:
        """Probes this request took and will never deliver."""
        ...


# -- settings -----------------------------------------------------------------------------

# Stage errors that are the request's own doing: no node failed and no other route
# would do better, so the caller gets the error itself, not a failover.
REQUEST_FAULTS: frozenset[str] = frozenset({"payload_too_large", "prompt_too_long", "bad_request"})


@dataclass(frozen=True, slots=True)
class FlowOptions:
    max_attempts: int = 3  # routes tried per request, the first included
    max_replays: int = 2  # migrations of a generation's state onto a rescue route
    stage_timeout_s: float = 2.0  # per stage; a chain's deadline is per stage it spans
    chain: bool = False  # nodes forward to each other (else the router calls each stage)
    reconnect_grace_s: float = 3.0  # after the bus comes back, "no responders" may mean "not yet"
    resend_delay_s: float = 0.1
    # A stage timeout while the router heard nothing for deaf_after_s (ten telemetry
    # snapshots, half a stage timeout) is its own link's (hearing.py), excused for at
    # most isolation_limit_s per flight: a held link's reset and the move to another
    # server, with room.
    deaf_after_s: float = 1.0
    isolation_limit_s: float = 4.0
    # No route left after a node went silent: how long a request in flight waits for
    # one to come back (a partition healing, a node's connection moving) before it is
    # answered unrecoverable (lifecycle.py). 0: answered at once.
    route_wait_s: float = 5.0
    # A generation's stages may start it from a prefix of its prompt they keep cached
    # for its tenant (the scope is the tenant the bus vouched for).
    prefix_cache: bool = True
    # Down a chain, a long sequence's first stage runs its chunks one after another and
    # forwards each as it is run, so several stages compute at once; each chunk's reply
    # comes back on the one send (hecate_node.chain).
    run_ahead: bool = True


# -- failures -----------------------------------------------------------------------------

FailureKind = Literal[
    "no_responders",  # NATS: nobody listens on the node's subject
    "timeout",  # no outcome within the stage deadline
    "node_down",  # telemetry declared a node the dispatch waits on dead
    "error_reply",  # the node answered with an error
    "unreadable",  # the node's reply did not decode
    "publish_failed",  # the stage never left the router (disconnected)
    "too_large",  # the stage outgrew the bus's max_payload: nobody failed
    "unsendable",  # the stage could not be encoded (the request's own data): nobody failed
]


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a dispatch failed, typed; ``reason`` is what logs and events show."""

    kind: FailureKind
    reason: str
    code: str | None = None  # error_reply: the node's code, as it sent it
    retry_after_s: float | None = None

    @property
    def breaker_code(self) -> str:
        """What the shared breaker records as the cause: the node's own error code, or
        the kind of failure (the breaker tells silence from errors by it)."""
        return self.code if self.kind == "error_reply" and self.code else self.kind

    @property
    def silent(self) -> bool:
        """The node did not answer at all: liveness news, which is telemetry's, not the
        breaker's (a node declared down is routed around and back at its next beat)."""
        return self.kind in ("no_responders", "node_down")


# -- events -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    now: float


@dataclass(frozen=True, slots=True)
class StageReplied:
    send: int
    stage: int  # which stage of the route answered (in a chain, the last one, or a failure's)
    reply: StageReply | ErrorReply
    now: float


@dataclass(frozen=True, slots=True)
class StageFailed:
    send: int
    stage: int
    failure: Failure
    now: float
    since_reconnect_s: float = float("inf")  # how long ago the bus connection came back


@dataclass(frozen=True, slots=True)
class NodeDown:
    node_id: str
    reason: str
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


@dataclass(frozen=True, slots=True)
class RetryJoined:
    reply_to: str


@dataclass(frozen=True, slots=True)
class Cancelled:
    now: float


@dataclass(frozen=True, slots=True)
class Abort:
    """The router is stopping (or otherwise gives up): answer with this error now."""

    code: ErrorCode
    message: str
    now: float


Event = Start | StageReplied | StageFailed | NodeDown | Tick | RetryJoined | Cancelled | Abort


# -- actions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Publish ``request`` to ``node_id``; its outcome is reported as send ``send``."""

    send: int
    stage: int
    node_id: str
    request: StageRequest
    chained: int  # how many stages after this one the nodes forward to each other


@dataclass(frozen=True, slots=True)
class Stream:
    token: StreamToken


@dataclass(frozen=True, slots=True)
class Report:
    """A stage's outcome, for the shared circuit breaker of ``node_id``."""

    node_id: str
    ok: bool
    code: str = ""
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Suspect:
    """``node_id`` just failed a stage: new requests steer clear of it until telemetry
    hears from it again (the router's view keeps the suspicion, on its own clock)."""

    node_id: str


@dataclass(frozen=True, slots=True)
class Move:
    """The request's load leaves ``old`` for ``new`` (a rescue route)."""

    old: Route
    new: Route


@dataclass(frozen=True, slots=True)
class Release:
    """The nodes of ``route`` may drop ``session``'s caches now."""

    route: Route
    session: str


@dataclass(frozen=True, slots=True)
class Sample:
    """A measured round trip of ``pipeline_id``, for its admission limit."""

    pipeline_id: str
    seconds: float
    now: float


@dataclass(frozen=True, slots=True)
class Answer:
    """The one reply: to the caller, and to ``also``, every retry of it that joined.
    Only a :class:`Release` may follow it; its route carries no more of this load."""

    reply: InferReply
    also: tuple[str, ...]
    route: Route


# A Failover (hecate.wire.messages) is an action as it is: the shell publishes it
# stamped with the router's id and the time (FailoverEvent).
Action = Send | Stream | Report | Suspect | Failover | Move | Release | Sample | Answer
