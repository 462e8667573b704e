"""Typed errors of the swarm core, and the codes an error reply can carry.

Every error is a value a caller can act on: a stable ``code`` (for the wire and for
metrics) and a message that tells an operator what happened and what to do next.

:data:`ErrorCode` is every code HECATE puts in an error reply. It lives here, the
lowest module the core, the wire and the model libraries all import, so that each of
them annotates what it emits with it: a typo or a code nobody listed fails mypy, not a
caller. ``hecate.wire.errors`` gives each code its status and the contract its lists.
"""

from __future__ import annotations

from typing import ClassVar, Literal

ErrorCode = Literal[
    "bad_request",
    "forbidden",
    "unknown_type",
    "bad_activation",
    "bad_range",
    "bad_max_tokens",
    "no_such_model",
    "unknown_node",
    "not_hosted",
    "session_lost",
    "prefix_lost",
    "unknown_executor",
    "payload_too_large",
    "prompt_too_long",
    "rate_limited",
    "cancelled",
    "internal",
    "forward_failed",
    "upstream_error",
    "upstream_rejected",
    "no_healthy_pipeline",
    "no_responders",
    "unrecoverable",
    "draining",
    "no_plan",
    "swarm_stopped",
    "timeout",
]
"""Every code an error reply can carry (``hecate.wire.errors.STATUS`` has exactly these
keys). What a peer *sends* stays a ``str`` (``ErrorBody.code``): a newer one may know a
code this one does not; ``hecate.wire.errors.as_code`` reads it as one of these."""


class HecateError(Exception):
    """Base of every error the core raises on purpose."""

    # A plain string: most of these stop a command or a start-up and never reach the
    # wire (``bad_topology``, ``nats_unreachable``); the routing errors, which do, narrow
    # it to an ErrorCode.
    code: ClassVar[str] = "hecate_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class RoutingError(HecateError):
    """A request could not be given a correct route.

    Subclasses are also reachable as attributes (``RoutingError.Unrecoverable``), the
    spelling the specification uses.
    """

    # Never raised itself, only its subclasses; one raised bare would be HECATE's fault.
    code: ClassVar[ErrorCode] = "internal"

    NoSuchModel: ClassVar[type[NoSuchModel]]
    NoHealthyPipeline: ClassVar[type[NoHealthyPipeline]]
    Unrecoverable: ClassVar[type[Unrecoverable]]
    UnknownNode: ClassVar[type[UnknownNode]]
    SwarmStopped: ClassVar[type[SwarmStopped]]
    Saturated: ClassVar[type[Saturated]]


class NoSuchModel(RoutingError):
    """The plan has no pipeline for the requested model (never served by another one)."""

    code = "no_such_model"


class NoHealthyPipeline(RoutingError):
    """Every pipeline of the model has at least one node down."""

    code = "no_healthy_pipeline"


class Saturated(RoutingError):
    """Every healthy pipeline of the model already carries as many requests as it can
    take: the request waits for room, or is refused as ``rate_limited``. Load, never a
    reason to fail over or degrade."""

    code = "rate_limited"


class Unrecoverable(RoutingError):
    """Failover found no replica, no splice and no permitted degradation.

    This is the controlled signal an orchestrator waits for to decide whether to degrade
    or shut down; it is returned by :func:`failover_in_swarm` rather than raised, and may
    be raised by callers that prefer exceptions.
    """

    code = "unrecoverable"

    def __init__(self, message: str, *, model_id: str = "", lost_node: str = "") -> None:
        super().__init__(message)
        self.model_id = model_id
        self.lost_node = lost_node


class UnknownNode(RoutingError):
    """A node id that is not a member of the swarm."""

    code = "unknown_node"


class SwarmStopped(RoutingError):
    """The swarm was stopped; it routes nothing until started again."""

    code = "swarm_stopped"


RoutingError.NoSuchModel = NoSuchModel
RoutingError.NoHealthyPipeline = NoHealthyPipeline
RoutingError.Unrecoverable = Unrecoverable
RoutingError.Saturated = Saturated
RoutingError.UnknownNode = UnknownNode
RoutingError.SwarmStopped = SwarmStopped


class PlanError(HecateError):
    """A plan could not be made from the given models and nodes."""

    code = "plan_error"


class InsufficientCapacity(PlanError):
    """The nodes cannot hold even one complete pipeline of the base model."""

    code = "insufficient_capacity"


class DuplicateNode(PlanError):
    """A node joined under an id that is already a member."""

    code = "duplicate_node"


class UnknownPlanner(PlanError):
    """No planner strategy is registered under the requested name."""

    code = "unknown_planner"
