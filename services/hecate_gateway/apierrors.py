"""OpenAI's error shape, and how each swarm error code reaches an HTTP client in it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hecate.wire import errors as wire_errors

Kind = Literal["chat", "completion"]


@dataclass(frozen=True)
class ApiError(Exception):
    """An answer in OpenAI's error shape: HTTP ``status``, ``type``, ``code``, ``param``."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # A generation that broke mid-way: the text it had produced.
    partial: str | None = None

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if self.partial is not None:
            error["partial_output"] = self.partial
        return {"error": error}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# How each swarm error code reaches an HTTP client: (status, type, code). A code not
# listed keeps its wire status (4xx become 400: the request was wrong; 5xx stay).
SWARM_ERRORS: Mapping[wire_errors.ErrorCode, tuple[int, str, str | None]] = {
    "bad_request": (400, "invalid_request_error", None),
    "bad_max_tokens": (400, "invalid_request_error", None),
    "payload_too_large": (400, "invalid_request_error", "context_length_exceeded"),
    "prompt_too_long": (400, "invalid_request_error", "context_length_exceeded"),
    "no_such_model": (404, "invalid_request_error", "model_not_found"),
    # The key's tenant may not ask (openai's client raises PermissionDeniedError).
    "forbidden": (403, "invalid_request_error", "permission_denied"),
    "rate_limited": (429, "requests", "rate_limit_exceeded"),
    # Nobody serves it now, however the swarm says it: the client may try again.
    "unknown_node": (503, "server_error", "unknown_node"),
    "session_lost": (503, "server_error", "session_lost"),
    "prefix_lost": (503, "server_error", "prefix_lost"),
    "not_hosted": (503, "server_error", "not_hosted"),
    "no_responders": (503, "server_error", "no_router"),
    "timeout": (504, "server_error", "timeout"),
    "cancelled": (499, "server_error", "cancelled"),  # the client hung up: never seen
}
_PARAMS: Mapping[wire_errors.ErrorCode, str] = {
    "bad_max_tokens": "max_tokens",
    "no_such_model": "model",
    "prompt_too_long": "messages",
    "payload_too_large": "messages",
}


def swarm_error(code: str, message: str, *, kind: Kind, partial: str | None = None) -> ApiError:
    """The HTTP error for a swarm's error reply. ``code`` is read off the wire, so it may
    be one this gateway does not know (a newer swarm's): a 500 that still names it."""
    if not wire_errors.is_code(code):
        return ApiError(500, message, "server_error", code, partial=partial or None)
    status, kind_of, oa_code = SWARM_ERRORS.get(code, (0, "", code))
    if not status:
        wire = wire_errors.status(code)
        status, kind_of = (400, "invalid_request_error") if wire < 500 else (wire, "server_error")
    param = _PARAMS.get(code)
    if param == "messages" and kind == "completion":
        param = "prompt"
    return ApiError(status, message, kind_of, oa_code, param, partial=partial or None)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")
