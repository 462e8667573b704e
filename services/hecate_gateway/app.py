"""The gateway's HTTP surface: a Starlette app, every route a small handler.

Cross-cutting concerns are layers around handlers, not code in each: :func:`openai_errors`
turns an :class:`ApiError` into OpenAI's error shape, :func:`authorized` resolves the
caller's tenant from its key (401 otherwise), :class:`Traced` gives each HTTP request a
span (the swarm call's span is its child). Inference metrics are counted by the answer
itself (:mod:`hecate_gateway.completion`), since only it knows how a stream ended.

Probes and metrics need no key and touch nothing slow: ``/healthz/live`` answers at
once; ``/healthz/ready`` pings the routers at most once a second.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

from opentelemetry.trace import SpanKind, Tracer, TracerProvider
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hecate.bus import tracing
from hecate.core.kinds import ExecutorKind
from hecate_gateway import page
from hecate_gateway.bridge import Bridge
from hecate_gateway.completion import Completion, Context
from hecate_gateway.keys import Auth
from hecate_gateway.metrics import CONTENT_TYPE, Metrics
from hecate_gateway.openai import ApiError, Kind, parse, unauthorized
from hecate_gateway.shapes import error_body
from hecate_gateway.swarm import SwarmWatch

# The largest request body read: more than any request the bus carries (a router takes
# 256 KB), so nothing servable is refused, and no client can make the gateway buffer
# an unbounded body.
MAX_BODY_BYTES = 1024 * 1024

Handler = Callable[[Request], Awaitable[Response]]
TenantHandler = Callable[[Request, str], Awaitable[Response]]


@dataclass
class Gateway:
    """Everything the routes use."""

    bridge: Bridge
    auth: Auth
    watch: SwarmWatch
    metrics: Metrics
    log: logging.Logger
    tracer_provider: TracerProvider | None = None
    started: int = field(default_factory=lambda: int(time.time()))
    page_needs_key: bool = False  # the swarm page's data asks for an API key
    max_page_streams: int = page.MAX_STREAMS


def error_response(error: ApiError) -> Response:
    return Response(
        error_body(error), error.status, dict(error.headers), media_type="application/json"
    )


def openai_errors(handler: Handler, metrics: Metrics, endpoint: str) -> Handler:
    """Refusals before the swarm is asked (bad body, no key) in OpenAI's shape, and
    counted (with no model label: the client's string is not a label)."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as error:
            metrics.requests.labels(endpoint=endpoint, model="", status=str(error.status)).inc()
            return error_response(error)

    return guarded


def key_holder(auth: Auth, authorization: str | None, missing: str) -> str:
    """The tenant whose key ``authorization`` carries; raises the 401 to answer with
    (``missing``: what to say when there is no key at all)."""
    tenant = auth.tenant(authorization)
    if tenant is None:
        raise unauthorized(missing if authorization is None else "Incorrect API key provided.")
    return tenant


def authorized(auth: Auth, handler: TenantHandler) -> Handler:
    async def check(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        missing = "You didn't provide an API key: send Authorization: Bearer <key>."
        return await handler(request, key_holder(auth, authorization, missing))

    return check


def page_key(auth: Auth) -> page.Guard:
    """The swarm page's data for a caller with a key: an ``Authorization`` header, or
    the cookie the page sets (a browser's EventSource cannot send headers)."""

    def check(request: Request) -> Response | None:
        authorization = request.headers.get("authorization")
        cookie = unquote(request.cookies.get(page.KEY_COOKIE, ""))
        if authorization is None and cookie:
            authorization = f"Bearer {cookie}"
        missing = "The swarm's state needs an API key: send Authorization: Bearer <key>."
        try:
            key_holder(auth, authorization, missing)
        except ApiError as error:
            return error_response(error)
        return None

    return check


class Traced:
    """A server span around each HTTP request, named by its route, never by its path
    (paths are the client's to choose); its context goes into the NATS headers."""

    def __init__(self, app: ASGIApp, tracer: Tracer, names: frozenset[str]) -> None:
        self.app = app
        self.tracer = tracer
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in self.names else "other"
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with self.tracer.start_as_current_span(
            f"{scope['method']} {path}", context=tracing.extract(carrier), kind=SpanKind.SERVER
        ) as span:

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, send_traced)


def build_app(gw: Gateway) -> Starlette:
    """The gateway app. Mounts the swarm page's routes when that module is present."""
    ctx = Context(
        bridge=gw.bridge,
        watch=gw.watch,
        metrics=gw.metrics,
        log=gw.log,
        traced=tracing.enabled(gw.tracer_provider),
    )

    def completions(kind: Kind) -> TenantHandler:
        async def handle(request: Request, tenant: str) -> Response:
            body = await read_body(request)
            prepared = parse(kind, body)
            # Same tenant, same body: the client's own retry of a refused request.
            digest = hashlib.sha256(body).hexdigest()
            return Completion(ctx, prepared, tenant, digest)

        return handle

    async def models(_request: Request, _tenant: str) -> Response:
        watch = gw.watch
        data = [_model(m, gw.started, watch.executor_kind(m)) for m in watch.servable_models()]
        return JSONResponse({"object": "list", "data": data})

    async def model(request: Request, _tenant: str) -> Response:
        model_id = request.path_params["model"]
        if model_id not in gw.watch.servable_models():
            raise ApiError(
                404,
                f"The model `{model_id}` does not exist.",
                code="model_not_found",
                param="model",
            )
        return JSONResponse(_model(model_id, gw.started, gw.watch.executor_kind(model_id)))

    async def live(_request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(_request: Request) -> Response:
        missing = []
        if not gw.bridge.connected:
            missing.append("nats: not connected")
        elif not await gw.bridge.router_answers():
            missing.append("router: none answers $SRV.PING")
        if not gw.watch.has_plan:
            missing.append("plan: none published yet")
        return JSONResponse({"ready": not missing, "missing": missing}, 503 if missing else 200)

    async def metrics(_request: Request) -> Response:
        return Response(gw.metrics.render(), media_type=CONTENT_TYPE)

    def api(endpoint: str, handler: TenantHandler) -> Handler:
        return openai_errors(authorized(gw.auth, handler), gw.metrics, endpoint)

    routes: list[BaseRoute] = [
        Route("/v1/chat/completions", api("chat", completions("chat")), methods=["POST"]),
        Route("/v1/completions", api("completions", completions("completion")), methods=["POST"]),
        Route("/v1/models", api("models", models), methods=["GET"]),
        Route("/v1/models/{model}", api("models", model), methods=["GET"]),
        Route("/healthz/live", live, methods=["GET"]),
        Route("/healthz/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *page.routes(
            gw.watch,
            guard=page_key(gw.auth) if gw.page_needs_key else page.anyone,
            max_streams=gw.max_page_streams,
        ),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    if ctx.traced:
        names = frozenset(r.path for r in routes if isinstance(r, Route))
        tracer = tracing.tracer(gw.tracer_provider, "hecate_gateway")
        app.add_middleware(Traced, tracer=tracer, names=names)
    return app


def too_large() -> ApiError:
    return ApiError(
        413,
        f"The request body is larger than {MAX_BODY_BYTES:,} bytes.",
        code="request_too_large",
    )


async def read_body(request: Request) -> bytes:
    """The body, refused (413) as soon as it is known to pass :data:`MAX_BODY_BYTES`:
    by its declared length, else while it streams in."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large()
        chunks.append(chunk)
    return b"".join(chunks)


async def http_error(_request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path, method not allowed) in OpenAI's shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = {404: "No such endpoint.", 405: "Method not allowed."}.get(
        status, "The server could not answer this request."
    )
    code = {404: "unknown_url", 405: "method_not_allowed"}.get(status)
    headers = exc.headers if isinstance(exc, HTTPException) else None
    return error_response(ApiError(status, message, code=code, headers=headers or {}))


def _model(model_id: str, created: int, kind: ExecutorKind | None) -> dict[str, object]:
    """OpenAI's model object, and what this model's answers can be asked for: only a
    model whose nodes sample each token (a ``steps`` executor) can hold an answer to a
    shape or say its tokens' log-probabilities, and only its nodes keep the KV caches
    a prompt's cached prefix is reused from (when the routers have it on)."""
    samples = kind == "steps"
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "hecate",
        "capabilities": {
            "response_format": ["text", "json_object", "json_schema"] if samples else ["text"],
            "logprobs": samples,
            "tools": samples,
            "prefix_cache": samples,
        },
    }
