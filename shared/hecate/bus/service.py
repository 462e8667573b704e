"""The shell every HECATE service runs in.

It owns what handlers must not repeat: two connections (inbound subscriptions, outbound
publishes and KV, so that draining one never strands the other's replies), decoding with
size limits, typed error replies (never a stack trace on the wire), trace context and a
server span per message, concurrency limits, per-endpoint statistics, and the NATS
service API (``$SRV.PING/INFO/STATS``, ADR-32) implemented here because ``nats.micro``
endpoints handle one request at a time and stop non-gracefully.

A handler is ``async (request, headers) -> reply struct``; it raises
:class:`ServiceError` for an error the caller should see.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from opentelemetry import trace
from opentelemetry.trace import SpanKind, TracerProvider

from hecate.bus import tracing
from hecate.bus.credentials import Credentials
from hecate.bus.logs import event
from hecate.core.errors import ErrorCode, HecateError
from hecate.wire.errors import STATUS, error_headers
from hecate.wire.messages import ErrorBody, ErrorReply

__all__ = ["STATUS", "Service", "ServiceError", "connect", "encode", "error_headers"]

Codec = Literal["json", "msgpack"]
NO_RESPONDERS = "503"  # the Status header NATS puts on a reply when nobody listened
_log = logging.getLogger("hecate.bus")
VERSION = "0.1.0"

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


Handler = Callable[[Any, Mapping[str, str]], Awaitable[msgspec.Struct | None]]
"""A handler returns its reply, or None when someone else answers (a forwarded stage)."""
_NO_SPAN = trace.INVALID_SPAN  # a context manager that records nothing


async def _quiet(exc: Exception) -> None:
    """nats-py prints a traceback per failed (re)connect by default; once is plenty."""
    _log.debug("nats: %r", exc)


async def connect(
    url: str,
    name: str,
    *,
    timeout: float = 10.0,
    reconnected_cb: Callable[[], Awaitable[None]] | None = None,
    credentials: Credentials | None = None,
) -> Client:
    """Connect, retrying until ``timeout`` (services may start before the server); once
    connected, reconnect forever. Credentials come from the environment unless given
    (see :mod:`hecate.bus.credentials`)."""
    creds = Credentials.from_env() if credentials is None else credentials
    deadline = time.monotonic() + timeout
    last: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        last[:] = [exc]
        await _quiet(exc)

    while True:
        left = deadline - time.monotonic()
        try:
            # Bounded: with reconnects on, nats-py would retry a refused first connect
            # (bad credentials, an untrusted certificate) forever.
            return await asyncio.wait_for(
                nats.connect(
                    [u.strip() for u in url.split(",") if u.strip()],  # a cluster: a,b,c
                    name=name,
                    connect_timeout=1,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.25,
                    ping_interval=5,
                    max_outstanding_pings=3,
                    error_cb=on_error,
                    reconnected_cb=reconnected_cb,
                    **creds.options(),
                ),
                max(left, 1.0),
            )
        except Exception as exc:
            if time.monotonic() > deadline:
                cause = last[0] if last else exc
                who = f" as {creds.user!r}" if creds.user else " anonymously"
                raise BusUnreachable(
                    f"cannot connect to NATS at {url}{who} within {timeout:g}s: {cause!r}"
                ) from None
            await asyncio.sleep(0.1)


class BusUnreachable(HecateError):
    """No connection to NATS in time (server down, credentials refused, TLS failed)."""

    code = "nats_unreachable"


class Service:
    """Connections, endpoints, $SRV discovery and graceful drain for one service instance."""

    def __init__(
        self,
        *,
        kind: str,
        name: str,
        instance_id: str,
        description: str,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
        max_payload: int = 1024 * 1024,
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.instance_id = instance_id
        self.description = description
        self.log = log
        self.tracer = tracing.tracer(tracer_provider, f"hecate.{kind}")
        self.tracing = tracing.enabled(tracer_provider)
        self.max_payload = max_payload
        self.metadata = metadata or {}
        self.started = datetime.now(UTC).isoformat()
        self.endpoints: list[EndpointStats] = []
        self.inbound: Client | None = None
        self.outbound: Client | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # in-flight handlers: awaited on stop
        self._background: set[asyncio.Task[None]] = set()  # loops and watchers: cancelled
        self._subs: list[Any] = []
        # When a connection last came back after losing the server (monotonic; 0: never).
        # Right after, other clients may not have resubscribed yet: a no-responders then
        # can mean "not back yet", not "gone".
        self.reconnected_at = 0.0

    async def _reconnected(self) -> None:
        self.reconnected_at = time.monotonic()
        event(self.log, "reconnected", logging.WARNING)

    @property
    def nc(self) -> Client:
        """The outbound connection: publishes, requests and KV."""
        assert self.outbound is not None, "service not started"
        return self.outbound

    async def start(self, url: str) -> None:
        self.inbound = await connect(
            url, f"{self.name}-{self.instance_id}-in", reconnected_cb=self._reconnected
        )
        self.outbound = await connect(
            url, f"{self.name}-{self.instance_id}-out", reconnected_cb=self._reconnected
        )
        for verb in ("PING", "INFO", "STATS"):
            for subject in (
                f"$SRV.{verb}",
                f"$SRV.{verb}.{self.name}",
                f"$SRV.{verb}.{self.name}.{self.instance_id}",
            ):
                self._subs.append(await self.inbound.subscribe(subject, cb=self._srv(verb)))

    async def ready(self) -> None:
        """Flush subscriptions so a request sent right after does not miss them."""
        assert self.inbound is not None
        await self.inbound.flush()

    # -- endpoints ---------------------------------------------------------------------

    async def add_endpoint(
        self,
        name: str,
        subject: str,
        request_type: type[Any],
        handler: Handler,
        *,
        codec: Codec = "json",
        queue: str | None = None,
        concurrency: int = 1,
        traced: bool = True,
    ) -> EndpointStats:
        """Serve ``subject``: decode ``request_type``, call ``handler``, reply in ``codec``
        (when the message has a reply subject and the handler returns a reply).

        ``traced=False`` skips spans for chatty fire-and-forget subjects (heartbeats)."""
        assert self.inbound is not None
        stats = EndpointStats(name=name, subject=subject, queue_group=queue)
        self.endpoints.append(stats)
        decoder: Any = (
            msgspec.json.Decoder(request_type)
            if codec == "json"
            else msgspec.msgpack.Decoder(request_type)
        )
        limit = asyncio.Semaphore(concurrency)

        span_name = f"{self.kind} {name}"

        async def serve(msg: Msg) -> None:
            started = time.perf_counter_ns()
            stats.num_requests += 1
            headers = msg.headers or {}
            # With nothing exporting, skip context extraction and the span altogether.
            tracing_on = self.tracing and traced
            context = tracing.extract(headers) if tracing_on else None
            with (
                self.tracer.start_as_current_span(span_name, context=context, kind=SpanKind.SERVER)
                if tracing_on
                else _NO_SPAN as span
            ):
                try:
                    if len(msg.data) > self.max_payload:
                        raise ServiceError(
                            "payload_too_large", f"{len(msg.data)} bytes > limit {self.max_payload}"
                        )
                    try:
                        request = decoder.decode(msg.data)
                    except msgspec.DecodeError as exc:
                        raise ServiceError("bad_request", f"{name}: {exc}") from None
                    reply = await handler(request, headers)
                    if msg.reply and reply is not None:
                        body = encode(reply, codec)
                        try:
                            await self.nc.publish(msg.reply, body)
                        except MaxPayloadError:
                            raise ServiceError(
                                "payload_too_large",
                                f"{name}: the reply is {len(body):,} bytes, over the bus's "
                                f"max_payload of {self.nc.max_payload:,}",
                            ) from None
                except ServiceError as exc:
                    span.set_attribute("error.code", exc.code)
                    self._count_error(stats, exc.code, exc.message)
                    await self.reply_error(
                        msg.reply, exc.code, exc.message, codec, retry_after_s=exc.retry_after_s
                    )
                except Exception as exc:  # never a stack trace on the wire
                    self._count_error(stats, "internal", repr(exc))
                    self.log.exception("handler failed", extra={"fields": {"endpoint": name}})
                    await self.reply_error(
                        msg.reply, "internal", f"{name} failed; see its logs", codec
                    )
                finally:
                    stats.processing_ns += time.perf_counter_ns() - started

        async def on_message(msg: Msg) -> None:
            if concurrency == 1:
                await serve(msg)
                return
            await limit.acquire()  # backpressure: the subscription waits for a slot
            task = asyncio.create_task(serve(msg))
            self._tasks.add(task)

            def finished(t: asyncio.Task[None]) -> None:
                self._tasks.discard(t)
                limit.release()

            task.add_done_callback(finished)

        self._subs.append(await self.inbound.subscribe(subject, queue=queue or "", cb=on_message))
        return stats

    async def add_raw(
        self,
        name: str,
        subject: str,
        callback: Callable[[Msg], Awaitable[None]],
        *,
        queue: str | None = None,
    ) -> EndpointStats:
        """Serve ``subject`` with a raw callback that keeps its own ``EndpointStats``."""
        assert self.inbound is not None
        stats = EndpointStats(name=name, subject=subject, queue_group=queue)
        self.endpoints.append(stats)
        self._subs.append(await self.inbound.subscribe(subject, queue=queue or "", cb=callback))
        return stats

    def _count_error(self, stats: EndpointStats, code: ErrorCode, message: str) -> None:
        stats.num_errors += 1
        stats.last_error = f"{code}: {message}"[:256]
        rejected = stats.data.setdefault("rejected", {})
        first = code not in rejected
        rejected[code] = rejected.get(code, 0) + 1
        if first:  # log the first of each kind; the counter carries the rest
            event(
                self.log,
                "request rejected",
                logging.WARNING,
                endpoint=stats.name,
                code=code,
                message=message[:200],
            )

    async def reply_error(
        self,
        reply: str | None,
        code: ErrorCode,
        message: str,
        codec: Codec = "json",
        body: msgspec.Struct | None = None,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        if not reply:
            return
        payload = (
            body
            if body is not None
            else ErrorReply(
                error=ErrorBody(code=code, message=message, retry_after_s=retry_after_s)
            )
        )
        await self.nc.publish(
            reply, encode(payload, codec), headers=error_headers(code, message, retry_after_s)
        )

    # -- $SRV (ADR-32) -----------------------------------------------------------------

    def _srv(self, verb: str) -> Callable[[Msg], Awaitable[None]]:
        async def answer(msg: Msg) -> None:
            if not msg.reply:
                return
            doc: dict[str, Any] = {
                "name": self.name,
                "id": self.instance_id,
                "version": VERSION,
                "metadata": self.metadata,
            }
            if verb == "PING":
                doc["type"] = "io.nats.micro.v1.ping_response"
            elif verb == "INFO":
                doc["type"] = "io.nats.micro.v1.info_response"
                doc["description"] = self.description
                doc["endpoints"] = [
                    {
                        "name": e.name,
                        "subject": e.subject,
                        "queue_group": e.queue_group or "",
                        "metadata": {},
                    }
                    for e in self.endpoints
                ]
            else:
                doc["type"] = "io.nats.micro.v1.stats_response"
                doc["started"] = self.started
                doc["endpoints"] = [e.as_json() for e in self.endpoints]
            assert self.inbound is not None
            await self.inbound.publish(msg.reply, json.dumps(doc).encode())

        return answer

    # -- lifecycle ---------------------------------------------------------------------

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """A background loop owned by the service (cancelled on stop, after the drain)."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def drain_inbound(self, grace: float = 5.0) -> None:
        """Stop taking messages. Never raises: with the server gone there is nothing to
        drain, and a service on its way out must not die with a traceback."""
        if self.inbound is None or self.inbound.is_closed:
            return
        try:
            await asyncio.wait_for(self.inbound.drain(), grace)
        except Exception as exc:
            event(self.log, "inbound drain incomplete", logging.WARNING, error=repr(exc))
            with contextlib.suppress(Exception):
                await self.inbound.close()

    async def stop(self, grace: float = 5.0) -> None:
        """Drain: stop taking messages, let in-flight handlers finish (up to ``grace``),
        then close the outbound connection (flushing replies)."""
        await self.drain_inbound(grace)
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            _done, late = await asyncio.wait(pending, timeout=grace)
            for t in late:
                t.cancel()
        loops = [t for t in self._background if not t.done()]
        for t in loops:
            t.cancel()
        if loops:
            await asyncio.wait(loops, timeout=grace)
        if self.outbound is not None and not self.outbound.is_closed:
            try:
                await asyncio.wait_for(self.outbound.drain(), grace)
            except Exception:
                with contextlib.suppress(Exception):
                    await self.outbound.close()
