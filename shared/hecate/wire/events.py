"""The events (JSON, fire-and-forget on ``hecate.events.*``): what routers, the planner,
telemetry, the breaker service and the launcher tell whoever follows them (the
swarm page, a log sink, ``hecate events``). Re-exported by :mod:`hecate.wire.messages`."""

from __future__ import annotations

from typing import Literal

import msgspec

from hecate.core.routing import Route

__all__ = [
    "BreakerChanged",
    "Failover",
    "FailoverEvent",
    "NodeEvent",
    "PlanChanged",
    "ServiceRestarted",
]


class Failover(msgspec.Struct, frozen=True, kw_only=True):
    """``lost_node`` failed this request, and how it was rescued: what a router's
    request lifecycle decides (an action) and, with who and when, what it publishes."""

    request_id: str
    model_id: str
    lost_node: str
    kind: Literal["replica", "splice", "degraded", "unrecoverable", "unaffected"]
    old_route: Route
    new_route: Route | None
    attempt: int
    reason: str


class FailoverEvent(Failover, frozen=True, kw_only=True):
    """A :class:`Failover` on ``hecate.events.failover``, stamped by the router that
    decided it (its id, its wall clock)."""

    router_id: str
    at: float


class PlanChanged(msgspec.Struct, frozen=True, kw_only=True):
    """The planner published the plan of ``epoch`` and wrote every node's assignment
    that it changed. ``changed`` names those nodes (``None``: too many to name, each node
    reads its own); ``previous`` is the epoch before it, so that a node that missed a
    notice knows to read its assignment. The planner says it again now and then
    (``previous`` = ``epoch``, nothing ``changed``): a notice is fire-and-forget."""

    epoch: int
    strategy: str
    planner_id: str
    pipelines: int
    reason: str
    at: float
    previous: int = 0
    nodes: int = 0  # in the plan: what each node paces its heartbeats by
    changed: tuple[str, ...] | None = None


class BreakerChanged(msgspec.Struct, frozen=True, kw_only=True):
    target: str
    state: Literal["closed", "open", "half_open"]
    open_until: float
    reason: str
    at: float


class NodeEvent(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    state: Literal["down", "up"]
    reason: str
    at: float


class ServiceRestarted(msgspec.Struct, frozen=True, kw_only=True):
    """A launcher (``hecate up``) started ``label`` again after it exited with
    ``exit_code`` (negative: killed by that signal); ``restarts`` counts its restarts
    so far, ``delay_s`` the pause before this one (it doubles with each exit in a row)."""

    label: str
    exit_code: int
    restarts: int
    delay_s: float
    at: float
