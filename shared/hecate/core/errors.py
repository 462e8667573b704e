"""Typed errors of the swarm core.

Every error is a value a caller can act on: a stable ``code`` (for the wire and for
metrics) and a message that tells an operator what happened and what to do next.
"""

from __future__ import annotations

from typing import ClassVar


class HecateError(Exception):
    """Base of every error the core raises on purpose."""

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

    code = "routing_error"

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
