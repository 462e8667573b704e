"""One message on an endpoint, as a handler sees it: the :class:`Request` handle.

A handler either returns its reply (``handler(body, headers)``), or, when the endpoint
is *deferred*, gets the :class:`Request` handle and may answer through it later, after
it has returned (the way nats-py's ``micro`` hands a handler its request). A request is
answered at most once; the span and the processing time close when it is answered, or
when the handler returns if nobody is waiting for an answer. The layers that build a
request and carry it to the handler are in :mod:`hecate.bus.layers`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from opentelemetry import trace
from opentelemetry.trace import Span, Tracer

from hecate.bus.logs import event
from hecate.core.errors import ErrorCode
from hecate.wire.errors import error_headers
from hecate.wire.messages import ErrorBody, ErrorReply

__all__ = [
    "App",
    "Codec",
    "DeferredHandler",
    "Endpoint",
    "EndpointStats",
    "Handler",
    "Request",
    "ServiceError",
    "encode",
]

Codec = Literal["json", "msgpack"]
T = TypeVar("T")

_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()


def encode(value: object, codec: Codec = "json") -> bytes:
    return _json.encode(value) if codec == "json" else _msgpack.encode(value)


class ServiceError(Exception):
    """An error the caller should see, as ``{"ok": false, "error": {code, message}}``."""

    def __init__(self, code: ErrorCode, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass
class EndpointStats:
    name: str
    subject: str
    queue_group: str | None
    num_requests: int = 0
    num_errors: int = 0
    last_error: str = ""
    processing_ns: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    status: Callable[[], dict[str, Any]] | None = None  # computed only when asked (STATS)

    def as_json(self) -> dict[str, Any]:
        n = max(self.num_requests, 1)
        data = {**self.data, **self.status()} if self.status is not None else self.data
        return {
            "name": self.name,
            "subject": self.subject,
            "queue_group": self.queue_group or "",
            "num_requests": self.num_requests,
            "num_errors": self.num_errors,
            "last_error": self.last_error,
            "processing_time": self.processing_ns,
            "average_processing_time": self.processing_ns // n,
            "data": data,
        }

    def rejected(self, code: ErrorCode, message: str, log: logging.Logger) -> None:
        """Count an error reply; the first of each code is logged, the counter has the rest."""
        self.num_errors += 1
        self.last_error = f"{code}: {message}"[:256]
        rejected = self.data.setdefault("rejected", {})
        first = code not in rejected
        rejected[code] = rejected.get(code, 0) + 1
        if first:
            event(
                log,
                "request rejected",
                logging.WARNING,
                endpoint=self.name,
                code=code,
                message=message[:200],
            )


Handler = Callable[[Any, Mapping[str, str]], Awaitable[msgspec.Struct | None]]
"""A handler returns its reply, or None when someone else answers (a forwarded stage)."""
DeferredHandler = Callable[["Request[Any]"], Awaitable[None]]
"""A deferred handler answers through its request handle, now or after it returns."""
App = Callable[["Request[Any]"], Awaitable[None]]
"""A layer's view of everything inside it."""


@dataclass(eq=False)
class Endpoint:
    """What the layers and the request handles of one endpoint share."""

    name: str
    codec: Codec
    stats: EndpointStats
    log: logging.Logger
    outbound: Callable[[], Client]  # replies go out on the service's outbound connection
    tracer: Tracer
    traced: bool
    max_bytes: int
    deferred: bool
    decoder: Any  # msgspec.json.Decoder or msgspec.msgpack.Decoder of the request type
    span_name: str


class Request(Generic[T]):
    """One message on an endpoint, decoded; answered at most once, now or later.

    ``reply`` is "" when the sender expects no answer. ``data`` is the raw body (a
    router may forward it as is), ``body`` the decoded one. ``span`` is the server span,
    ended when the request is answered (or when the handler returns, if no answer is
    expected); it is the no-op span when nothing exports."""

    __slots__ = (
        "_answered",
        "_closed",
        "_endpoint",
        "_started",
        "body",
        "data",
        "headers",
        "reply",
        "span",
        "subject",
    )

    def __init__(self, endpoint: Endpoint, msg: Msg) -> None:
        self._endpoint = endpoint
        self._started = time.perf_counter_ns()
        self._answered = False
        self._closed = False
        self.subject: str = msg.subject
        self.reply: str = msg.reply or ""
        self.headers: Mapping[str, str] = msg.headers or {}
        self.data: bytes = msg.data
        self.body: T  # set by the decode layer; a handler never sees a request without it
        self.span: Span = trace.INVALID_SPAN

    @property
    def answered(self) -> bool:
        return self._answered

    async def respond(
        self, reply: msgspec.Struct | bytes, headers: dict[str, str] | None = None
    ) -> bool:
        """Answer with ``reply`` (encoded with the endpoint's codec unless bytes).

        Returns False, and sends nothing, if the request was already answered. A reply
        over the bus's max_payload is turned into a ``payload_too_large`` error reply."""
        if self._answered:
            return False
        self._answered = True
        try:
            if self.reply:
                ep = self._endpoint
                body = reply if isinstance(reply, bytes) else encode(reply, ep.codec)
                try:
                    await ep.outbound().publish(self.reply, body, headers=headers)
                except MaxPayloadError:
                    message = (
                        f"{ep.name}: the reply is {len(body):,} bytes, over the bus's "
                        f"max_payload of {ep.outbound().max_payload:,}"
                    )
                    await self._send_error("payload_too_large", message, None, None)
        finally:
            self.close()
        return True

    async def error(
        self,
        code: ErrorCode,
        message: str,
        *,
        retry_after_s: float | None = None,
        body: msgspec.Struct | None = None,
    ) -> bool:
        """Answer with a typed error (error headers and an ``ErrorReply``, or ``body`` if
        given), counted in the endpoint's stats. Returns False, and sends and counts
        nothing, if the request was already answered."""
        if self._answered:
            return False
        self._answered = True
        try:
            await self._send_error(code, message, retry_after_s, body)
        finally:
            self.close()
        return True

    async def _send_error(
        self,
        code: ErrorCode,
        message: str,
        retry_after_s: float | None,
        body: msgspec.Struct | None,
    ) -> None:
        ep = self._endpoint
        self.span.set_attribute("error.code", code)
        ep.stats.rejected(code, message, ep.log)
        if not self.reply:
            return
        payload = (
            body
            if body is not None
            else ErrorReply(
                error=ErrorBody(code=code, message=message, retry_after_s=retry_after_s)
            )
        )
        await ep.outbound().publish(
            self.reply,
            encode(payload, ep.codec),
            headers=error_headers(code, message, retry_after_s),
        )

    def close(self) -> None:
        """End the span and the processing time (once); answering does this itself."""
        if self._closed:
            return
        self._closed = True
        self._endpoint.stats.processing_ns += time.perf_counter_ns() - self._started
        self.span.end()
