"""The router's settings: one validated struct, built by ``hecate router`` from its flags."""

from __future__ import annotations

from typing import Literal

import msgspec

from hecate.core import FailoverOptions
from hecate_router.flow import FlowOptions
from hecate_router.identity import TenantSource
from hecate_router.limits import LimitOptions
from hecate_router.retrybook import MAX_JOINED, REMEMBER_BYTES

# What each request's lifecycle runs on by default: the router's defaults for the same
# settings are these, declared once (FlowOptions), not copied.
FLOW = FlowOptions()


class RouterConfig(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    failover: FailoverOptions = FailoverOptions()
    max_attempts: int = FLOW.max_attempts  # routes tried per request, the first included
    max_replays: int = FLOW.max_replays  # migrations of a generation onto a rescue route
    stage_timeout_s: float = FLOW.stage_timeout_s
    # No route left after nodes went silent: a request in flight waits this long for
    # one to come back before it is answered unrecoverable (hecate_router.lifecycle).
    route_wait_s: float = FLOW.route_wait_s
    suspect_s: float = 2.0  # how long a node that failed a stage is routed around
    stale_s: float = 2.0  # telemetry older than this is not trusted for load
    max_request_bytes: int = 256 * 1024
    dispatch: Literal["hop", "chain"] = "hop"
    breaker_probe_timeout_s: float = 10.0
    enforce_quotas: bool = False
    quota_timeout_s: float = 1.0
    remember_answers: int = 10_000  # answers kept for idempotent retries
    remember_answer_bytes: int = REMEMBER_BYTES  # and the most they hold, headers included
    # Retries of one running request held for its answer; a retry past them is answered
    # rate_limited (hecate_router.retries).
    max_joined_retries: int = MAX_JOINED
    limits: LimitOptions = LimitOptions()
    queue_limit: int = 1024
    # The least and the most a request may wait in line for room (the most is never
    # less than the least): between them, what the line ahead needs at the rate
    # requests finish (hecate_router.admission).
    queue_timeout_s: float = 5.0
    queue_max_wait_s: float = 60.0
    # The longest a node is forgiven "no responders" after the router's own reconnect
    # (it may not have resubscribed yet); what the router hears since usually ends it
    # far sooner for each node (hecate_router.reconnect).
    reconnect_grace_s: float = FLOW.reconnect_grace_s
    # Where a request's tenant comes from: the account the bus vouches for ("bus", for a
    # bus with one account per tenant), or the body's unauthenticated field ("body").
    tenant_from: TenantSource = "body"
    # Generations start from a prompt prefix their pipeline's nodes keep cached for the
    # same tenant (hecate.llm.prefixes), and are routed towards where it is.
    prefix_cache: bool = FLOW.prefix_cache
    # A chain's first stage runs a long sequence's chunks ahead (hecate_node.chain).
    run_ahead: bool = FLOW.run_ahead

    def __post_init__(self) -> None:
        if not self.instance_id:
            raise ValueError("instance_id: must not be empty")
        for name in (
            "max_attempts",
            "max_request_bytes",
            "queue_limit",
            "remember_answers",
            "remember_answer_bytes",
            "max_joined_retries",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if self.max_replays < 0:
            raise ValueError(f"max_replays: must not be negative, got {self.max_replays}")
        for name in (
            "stage_timeout_s",
            "suspect_s",
            "stale_s",
            "breaker_probe_timeout_s",
            "quota_timeout_s",
            "queue_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be a positive number of seconds")
        if not self.queue_max_wait_s > 0:
            raise ValueError("queue_max_wait_s: must be a positive number of seconds")
        for name in ("reconnect_grace_s", "route_wait_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must not be negative")

    def flow(self) -> FlowOptions:
        """What each request's lifecycle needs of these."""
        return FlowOptions(
            max_attempts=self.max_attempts,
            max_replays=self.max_replays,
            stage_timeout_s=self.stage_timeout_s,
            chain=self.dispatch == "chain",
            reconnect_grace_s=self.reconnect_grace_s,
            route_wait_s=self.route_wait_s,
            prefix_cache=self.prefix_cache,
            run_ahead=self.run_ahead,
        )
