"""The layers around a handler, composed the way Starlette composes middleware.

Each layer is an ``App`` (a request in, nothing out) wrapping the next one:

    count -> errors -> trace -> limit -> decode -> handler

``count`` is outermost so every message, refused ones too, is in ``num_requests``, and
it closes a request nobody waits on when the handler returns; ``errors`` turns a
:class:`ServiceError` from any inner layer into a typed reply (never a stack trace on
the wire); ``trace`` comes before the refusals so a refused message is traced as well;
``limit`` comes before ``decode`` so an oversized body is never parsed. A malformed or
oversized message never reaches the handler.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, cast

import msgspec
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from hecate.bus import tracing
from hecate.bus.endpoint import App, DeferredHandler, Endpoint, Handler, Request, ServiceError

__all__ = ["compose"]


def count(app: App) -> App:
    async def layer(req: Request[Any]) -> None:
        ep = req._endpoint
        ep.stats.num_requests += 1
        try:
            await app(req)
        finally:
            # A deferred request that someone waits for closes when it is answered.
            if not (ep.deferred and req.reply) or req.answered:
                req.close()

    return layer


def errors(app: App) -> App:
    async def layer(req: Request[Any]) -> None:
        try:
            await app(req)
        except ServiceError as exc:
            await req.error(exc.code, exc.message, retry_after_s=exc.retry_after_s)
        except Exception as exc:  # never a stack trace on the wire
            ep = req._endpoint
            ep.log.exception("handler failed", extra={"fields": {"endpoint": ep.name}})
            if not await req.error("internal", f"{ep.name} failed; see its logs"):
                ep.stats.rejected("internal", repr(exc), ep.log)  # it failed after answering

    return layer


def trace_span(app: App) -> App:
    async def layer(req: Request[Any]) -> None:
        ep = req._endpoint
        req.span = ep.tracer.start_span(
            ep.span_name,
            context=tracing.extract(req.headers),
            kind=SpanKind.SERVER,
        )
        # The span is current while the handler runs, and ended by close(), not here: a
        # deferred request's span lasts until it is answered.
        with trace.use_span(
            req.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            await app(req)

    return layer


def limit(app: App) -> App:
    async def layer(req: Request[Any]) -> None:
        ep = req._endpoint
        if len(req.data) > ep.max_bytes:
            raise ServiceError("payload_too_large", f"{len(req.data)} bytes > limit {ep.max_bytes}")
        await app(req)

    return layer


def decode(app: App) -> App:
    async def layer(req: Request[Any]) -> None:
        ep = req._endpoint
        try:
            req.body = ep.decoder.decode(req.data)
        except msgspec.DecodeError as exc:
            raise ServiceError("bad_request", f"{ep.name}: {exc}") from None
        except RecursionError:  # msgspec's own bound on nesting, about 1,000 deep
            raise ServiceError("bad_request", f"{ep.name}: nested too deep") from None
        await app(req)

    return layer


def answering(handler: Handler) -> App:
    """Adapt a handler that returns its reply to the request handle."""

    async def app(req: Request[Any]) -> None:
        reply = await handler(req.body, req.headers)
        if reply is not None:
            await req.respond(reply)

    return app


def compose(
    endpoint: Endpoint, handler: Handler | DeferredHandler
) -> Callable[[Msg], Coroutine[Any, Any, None]]:
    """The message callback of ``endpoint``: its layers around ``handler``."""
    inner = cast(App, handler) if endpoint.deferred else answering(cast(Handler, handler))
    app = decode(inner)
    app = limit(app)
    if endpoint.traced:  # with nothing exporting, no context extraction and no span at all
        app = trace_span(app)
    app = count(errors(app))

    async def on_message(msg: Msg) -> None:
        await app(Request(endpoint, msg))

    return on_message
