"""The shell every HECATE service runs in.

It owns what handlers must not repeat: two connections (inbound subscriptions, outbound
publishes and KV, so that draining one never strands the other's replies), decoding with
size limits, typed error replies (never a stack trace on the wire), trace context and a
server span per message, concurrency limits, per-endpoint statistics, and the NATS
service API (``$SRV.PING/INFO/STATS``, ADR-32) implemented here because ``nats.micro``
endpoints handle one request at a time and stop non-gracefully.

A handler is ``async (request, headers) -> reply struct``; it raises
:class:`ServiceError` for an error the caller should see. A deferred handler gets a
:class:`Request` handle and answers through it, now or later. The layers around a
handler live in :mod:`hecate.bus.layers`.

Background loops (:meth:`Service.spawn`: watches, sweeps, heartbeats) run in one task
group. A loop that raises is a service that no longer does its job (a node whose plan
watch died still heartbeats, so it looks alive but never learns a new plan): it is
logged with the loop's name, the service's connections are closed, and the task that
started the service is cancelled, as a task group cancels the task that opened it, so
that the process exits nonzero (:func:`hecate.cli.process.run_service`) and its
supervisor restarts it. On :meth:`Service.stop` the loops are cancelled, which is not
a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from opentelemetry.trace import TracerProvider

from hecate.bus import discovery, tracing
from hecate.bus.connection import BusUnreachable, connect, one_order
from hecate.bus.endpoint import (
    Codec,
    DeferredHandler,
    Endpoint,
    EndpointStats,
    Handler,
    Request,
    ServiceError,
    encode,
)
from hecate.bus.layers import compose
from hecate.bus.logs import event
from hecate.bus.loops import LoopFailed, Loops
from hecate.bus.settle import settled
from hecate.core.errors import ErrorCode
from hecate.wire.errors import STATUS, error_headers
from hecate.wire.messages import ErrorBody, ErrorReply

__all__ = [
    "STATUS",
    "BusUnreachable",
    "EndpointStats",
    "LoopFailed",
    "Request",
    "Service",
    "ServiceError",
    "connect",
    "encode",
    "error_headers",
]

NO_RESPONDERS = "503"  # the Status header NATS puts on a reply when nobody listened
FAILED_GRACE_S = 5.0  # a failed service's in-flight handlers get this long to answer


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
        self.metadata = {**(metadata or {}), **discovery.restarted()}
        self.started = datetime.now(UTC).isoformat()
        self.endpoints: list[EndpointStats] = []
        self.inbound: Client | None = None
        self.outbound: Client | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # in-flight handlers: awaited on stop
        self.loops = Loops(log)  # watches, sweeps, heartbeats: cancelled on stop
        self._owner: asyncio.Task[Any] | None = None  # the task that started the service
        self._stopping = False
        self._subs: list[Any] = []
        self._back_at = 0.0
        self._reconnects_seen = 0

    @property
    def reconnected_at(self) -> float:
        """When a connection last came back after losing the server (monotonic; 0:
        never). Right after, other clients may not have resubscribed yet: a
        no-responders then can mean "not back yet", not "gone", and a silence then
        may be ours, not theirs.

        Read from the connections' own reconnect counts, not only from the
        reconnected callback: nats-py reports a connection connected (and delivers
        on it) one round trip before it calls back, and a reader in that gap must
        not take the outage for the others' fault.

        Read on every message the router's inbox takes: two look-ups and a compare
        while no connection came back, the clock only when one did."""
        i, o = self.inbound, self.outbound
        seen = (i.stats["reconnects"] if i is not None else 0) + (
            o.stats["reconnects"] if o is not None else 0
        )
        if seen != self._reconnects_seen:
            self._reconnects_seen = seen
            self._back_at = time.monotonic()
        return self._back_at

    async def _reconnected(self) -> None:
        self._back_at = time.monotonic()
        _ = self.reconnected_at  # counts this reconnect as seen
        event(self.log, "reconnected", logging.WARNING)

    @property
    def nc(self) -> Client:
        """The outbound connection: publishes, requests and KV."""
        assert self.outbound is not None, "service not started"
        return self.outbound

    async def start(self, url: str) -> None:
        # Both connections on one server, and onto the same next one when they lose it
        # (hecate.bus.connection.one_order): what hears the service can reach it.
        order = one_order(url)
        self.inbound = await connect(
            order,
            f"{self.name}-{self.instance_id}-in",
            reconnected_cb=self._reconnected,
            in_order=True,
        )
        self.outbound = await connect(
            order,
            f"{self.name}-{self.instance_id}-out",
            reconnected_cb=self._reconnected,
            in_order=True,
        )
        for verb, subject in discovery.subjects(self.name, self.instance_id):
            self._subs.append(await self.inbound.subscribe(subject, cb=self._srv(verb)))
        self._owner = asyncio.current_task()
        await self.loops.open(f"{self.name}-{self.instance_id}-loops", self._failed)

    @property
    def failure(self) -> LoopFailed | None:
        """The first background loop that failed, if one did."""
        return self.loops.failure

    async def ready(self) -> None:
        """Return once the server holds every subscription made so far, so a request
        sent right after does not miss them (``flush`` alone does not: bus/settle.py)."""
        assert self.inbound is not None
        await settled(self.inbound)

    # -- endpoints ---------------------------------------------------------------------

    async def add_endpoint(
        self,
        name: str,
        subject: str,
        request_type: type[Any],
        handler: Handler | DeferredHandler,
        *,
        codec: Codec = "json",
        queue: str | None = None,
        concurrency: int = 1,
        traced: bool = True,
        deferred: bool = False,
        max_bytes: int | None = None,
    ) -> EndpointStats:
        """Serve ``subject``: refuse a body over ``max_bytes`` (default: the service's
        max_payload), decode ``request_type``, and call ``handler``.

        ``handler(body, headers)`` returns its reply (sent in ``codec`` when the message
        has a reply subject) or None. With ``deferred=True`` it is ``handler(request)``
        and answers through the :class:`Request` handle, possibly after it returns.
        ``concurrency`` handlers run at once (a deferred one counts until it returns,
        not until it is answered). ``traced=False`` skips spans for chatty
        fire-and-forget subjects (heartbeats)."""
        assert self.inbound is not None
        stats = EndpointStats(name=name, subject=subject, queue_group=queue)
        self.endpoints.append(stats)
        endpoint = Endpoint(
            name=name,
            codec=codec,
            stats=stats,
            log=self.log,
            outbound=lambda: self.nc,
            tracer=self.tracer,
            traced=self.tracing and traced,
            max_bytes=self.max_payload if max_bytes is None else max_bytes,
            deferred=deferred,
            decoder=msgspec.json.Decoder(request_type)
            if codec == "json"
            else msgspec.msgpack.Decoder(request_type),
            span_name=f"{self.kind} {name}",
        )
        serve = compose(endpoint, handler)
        slots = asyncio.Semaphore(concurrency)

        async def on_message(msg: Msg) -> None:
            if concurrency == 1:
                await serve(msg)
                return
            await slots.acquire()  # backpressure: the subscription waits for a slot
            task = asyncio.create_task(serve(msg))
            self._tasks.add(task)

            def finished(t: asyncio.Task[None]) -> None:
                self._tasks.discard(t)
                slots.release()

            task.add_done_callback(finished)

        self._subs.append(await self.inbound.subscribe(subject, queue=queue or "", cb=on_message))
        return stats

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
        """An error reply to a message not served through a :class:`Request`."""
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
            doc = discovery.document(
                verb,
                name=self.name,
                instance_id=self.instance_id,
                description=self.description,
                metadata=self.metadata,
                started=self.started,
                endpoints=self.endpoints,
            )
            assert self.inbound is not None
            await self.inbound.publish(msg.reply, json.dumps(doc).encode())

        return answer

    # -- lifecycle ---------------------------------------------------------------------

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """A background loop owned by the service, in its task group: cancelled on stop
        (after the drain); if it raises, the service fails (see the module's doc).
        Spawned after stop has begun cancelling, or after a failure, it never runs."""
        return self.loops.spawn(coro)

    async def _failed(self, failure: LoopFailed) -> None:
        """A loop failed: close the service and cancel the task that started it."""
        if self._stopping:
            return  # failed while stopping, which goes on
        await self._drain_handlers(FAILED_GRACE_S)
        await self._close_outbound(FAILED_GRACE_S)
        owner = self._owner
        if owner is not None and not owner.done():
            owner.cancel(str(failure))

    async def _drain_handlers(self, grace: float) -> None:
        """Stop taking messages, and let in-flight handlers finish (up to ``grace``)."""
        await self.drain_inbound(grace)
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            _done, late = await asyncio.wait(pending, timeout=grace)
            for t in late:
                t.cancel()

    async def _close_outbound(self, grace: float) -> None:
        if self.outbound is not None and not self.outbound.is_closed:
            try:
                await asyncio.wait_for(self.outbound.drain(), grace)
            except Exception:
                with contextlib.suppress(Exception):
                    await self.outbound.close()

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
        cancel the background loops, then close the outbound connection (flushing
        replies). A loop that fails meanwhile is logged and recorded in ``failure``;
        the service, stopping already, goes on stopping."""
        self._stopping = True
        await self._drain_handlers(grace)
        await self.loops.close(grace)
        await self._close_outbound(grace)
