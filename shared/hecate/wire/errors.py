"""Error codes on the wire: one table, used by every service and by the contract.

Every code a service can put in an error reply is an :data:`ErrorCode` (the code that
emits one is annotated with it, so mypy refuses a code not listed there) and has its
status in :data:`STATUS`, whose keys are exactly the ErrorCode members.
:data:`INFER_CODES` and :data:`STAGE_CODES` are the ones a caller of
``hecate.infer.<model>`` and a node's caller can receive, with when; the contract's
lists are made from these tables, so they cannot drift from the code.

Every error reply carries ``{"ok": false, "error": {"code", "message"}}`` and three
headers: ``Nats-Service-Error`` (the message, one line), ``Nats-Service-Error-Code``
(an HTTP-like number, as the NATS service API expects) and ``Hecate-Error`` (the code).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final, TypeGuard, get_args

from hecate.core.errors import ErrorCode

__all__ = [
    "INFER_CODES",
    "STAGE_CODES",
    "STATUS",
    "ErrorCode",
    "as_code",
    "error_headers",
    "is_code",
    "status",
]

STATUS: Final[Mapping[ErrorCode, int]] = {
    "bad_request": 400,
    "forbidden": 403,
    "unknown_type": 400,
    "bad_activation": 400,
    "bad_range": 400,
    "bad_max_tokens": 400,
    "no_such_model": 404,
    "unknown_node": 404,
    "not_hosted": 409,
    "session_lost": 410,
    "prefix_lost": 410,
    "unknown_executor": 400,
    "payload_too_large": 413,
    "prompt_too_long": 413,
    "rate_limited": 429,
    # nginx's "client closed request": the caller hung up, nobody failed.
    "cancelled": 499,
    "internal": 500,
    "forward_failed": 502,
    "upstream_error": 502,
    "upstream_rejected": 502,
    "no_healthy_pipeline": 503,
    "no_responders": 503,
    "unrecoverable": 503,
    "draining": 503,
    "no_plan": 503,
    "swarm_stopped": 503,
    "timeout": 504,
}
"""Numeric status per error code (the keys are exactly the ErrorCode members)."""

INFER_CODES: Final[Mapping[ErrorCode, str]] = {
    "bad_request": "the request is not a valid InferRequest, or asks for nothing",
    "forbidden": "the request names a tenant other than the one the bus vouches for, or "
    "the bus vouches for none where the router requires it",
    "payload_too_large": "the request, or a stage's activations for its prompt, is larger "
    "than the bus carries (NATS max_payload)",
    "prompt_too_long": "the prompt and the tokens asked for exceed the model's context length",
    "no_plan": "the planner has not published a plan yet",
    "no_such_model": "the plan has no pipeline for this model (never served by another)",
    "no_healthy_pipeline": "every pipeline of the model has a node down",
    "unknown_node": "the route named a node the plan no longer has",
    "swarm_stopped": "the swarm was stopped",
    "unrecoverable": "a node was lost and no replica, splice or reserve could take over",
    "rate_limited": "the tenant's quota, an upstream, or a swarm with every pipeline busy "
    "and its line full said to slow down; see retry_after_s",
    "draining": "the router stopped before the answer",
    "timeout": "the router that took the request heard nothing from the swarm (its own "
    "link cut off) until its routes ran out: retry, through another router",
    "cancelled": "the caller cancelled the request (hecate.router.cancel) before its answer",
    "internal": "a fault in HECATE itself, not in the request; the message says where",
}
"""The codes a caller of ``hecate.infer.<model>`` can receive, and when."""

STAGE_CODES: Final[Mapping[ErrorCode, str]] = {
    "bad_request": "the request is not a valid StageRequest, or a step's token ids are "
    "outside the vocabulary",
    "payload_too_large": "the request, or the activation a chained stage forwards, is "
    "larger than the bus carries",
    "draining": "the node is shutting down",
    "not_hosted": "the node does not host that range in its plan epoch",
    "internal": "a fault in the node (or one injected by hecate.node.<id>.fault)",
    "bad_activation": "the activation is of the wrong size or type, or not finite",
    "bad_range": "the layer range is invalid, or the executor answers whole requests only",
    "bad_max_tokens": "max_tokens is outside 0..4096",
    "session_lost": "a generative step's session does not hold the positions it expects "
    "here: replay it",
    "prefix_lost": "a step asked this stage for a cached prompt prefix it no longer keeps: "
    "run the prompt whole",
    "prompt_too_long": "a sequence and the tokens it asks for exceed the model's context",
    "cancelled": "the router released the step's session",
    "forward_failed": "a chained stage could not be forwarded to the next node",
    "no_responders": "no node took the next chained stage (relayed by the one before it)",
    "rate_limited": "an upstream provider said to slow down; see retry_after_s",
    "upstream_error": "an upstream provider failed or could not be reached",
    "upstream_rejected": "an upstream provider refused the request",
}
"""The codes a node's error reply to ``hecate.node.<id>.stage`` can carry, and when."""

_CODES: Final[frozenset[str]] = frozenset(get_args(ErrorCode))


def is_code(code: str) -> TypeGuard[ErrorCode]:
    """Whether a code read off the wire is one this side knows."""
    return code in _CODES


def as_code(code: str) -> ErrorCode:
    """A code read off the wire, to pass on: one this side does not know (a newer peer's)
    is passed on as ``internal``, as this side cannot tell what it means."""
    return code if is_code(code) else "internal"


def status(code: ErrorCode) -> int:
    return STATUS[code]


def error_headers(
    code: ErrorCode, message: str, retry_after_s: float | None = None
) -> dict[str, str]:
    """The headers of an error reply; a "slow down" also says for how long, both as HTTP's
    whole-second ``Retry-After`` and the exact ``Retry-After-Ms``."""
    one_line = message.replace("\r", " ").replace("\n", " ")[:256]
    headers = {
        "Nats-Service-Error": one_line,
        "Nats-Service-Error-Code": str(status(code)),
        "Hecate-Error": code,
    }
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
        headers["Retry-After-Ms"] = str(math.ceil(retry_after_s * 1000))
    return headers
