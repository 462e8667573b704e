"""The live swarm page and its data: ``GET /`` (one HTML file shipped with the package:
inline CSS and JS, no CDN, nothing to build), ``GET /v1/swarm`` (the state as JSON, its
shape in :mod:`hecate_gateway.swarm`) and ``GET /v1/swarm/events`` (Server-Sent Events).

The event stream sends, as ``event: state``, the whole state (feed included) on
connect, then the state without its feed whenever it changed, at most every
``STATE_EVERY_S`` (telemetry rewrites itself ten times a second; a page redrawn at that
rate helps nobody); and, as ``event: feed``, each new or changed feed line as soon as it
arrives. A quiet swarm still gets a state every ``QUIET_S`` (tokens/s decays by itself)
and the connection a comment every ``KEEPALIVE_S`` (proxies drop silent streams).

The state is the swarm's (its nodes, routes, failures): where the gateway listens
beyond this machine, reading it takes an API key (``guard``), as a header or, for the
page itself (a browser's EventSource sends no headers), the :data:`KEY_COOKIE` the page
sets once it is given one. The page's HTML holds no state and is served to anyone, so
that it can ask for the key. At most ``max_streams`` event streams are open at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from hecate_gateway.swarm import SwarmWatch

STATE_EVERY_S = 0.2
QUIET_S = 1.0
KEEPALIVE_S = 15.0

MAX_STREAMS = 64
STREAMS_FULL_RETRY_S = 5  # what a refused stream is told: pages come and go in seconds

PAGE = Path(__file__).with_name("static") / "index.html"
KEY_COOKIE = "hecate_key"
_json = msgspec.json.Encoder()

# A refusal to answer ``request`` (its response), or None: go on.
Guard = Callable[[Request], Response | None]


def anyone(_request: Request) -> Response | None:
    return None


def routes(
    watch: SwarmWatch, *, guard: Guard = anyone, max_streams: int = MAX_STREAMS
) -> list[BaseRoute]:
    """The page's routes, to mount on the gateway's app; ``guard`` is asked before any
    state is served."""
    page = PAGE.read_bytes()  # read once: a page edited under a running gateway is not served
    open_streams = 0

    async def index(_request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    async def state(request: Request) -> Response:
        if (refused := guard(request)) is not None:
            return refused
        return Response(
            _json.encode(watch.snapshot()),
            media_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    def release() -> None:
        nonlocal open_streams
        open_streams -= 1

    async def events(request: Request) -> Response:
        nonlocal open_streams
        if (refused := guard(request)) is not None:
            return refused
        if open_streams >= max_streams:
            return Response(
                _json.encode(
                    {
                        "error": {
                            "message": f"{open_streams} swarm event streams are open, the "
                            f"most this gateway serves at once; retry in "
                            f"{STREAMS_FULL_RETRY_S} s",
                            "type": "rate_limit_error",
                            "code": "too_many_streams",
                        }
                    }
                ),
                429,
                {"Retry-After": str(STREAMS_FULL_RETRY_S)},
                media_type="application/json",
            )
        # Counted here, with the check and no await between: a stream counted once its
        # body began would let a burst of requests all pass the check before any began.
        open_streams += 1
        return _Counted(
            stream(watch),
            release,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return [
        Route("/", index, methods=["GET"], name="swarm_page"),
        Route("/v1/swarm", state, methods=["GET"], name="swarm_state"),
        Route("/v1/swarm/events", events, methods=["GET"], name="swarm_events"),
    ]


class _Counted(StreamingResponse):
    """A stream that gives its place back however it ends: finished, failed, or its
    client gone before its body began (when its generator never runs, nor its
    ``finally``)."""

    def __init__(
        self,
        content: AsyncGenerator[bytes, None],
        release: Callable[[], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._release: Callable[[], None] | None = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


def sse(kind: str, data: object) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


async def stream(watch: SwarmWatch) -> AsyncGenerator[bytes, None]:
    """The page's event stream, until the client goes (Starlette cancels it then)."""
    version = watch.version
    doc = watch.snapshot()
    rev = doc["feed_rev"]
    yield b"retry: 1000\n\n" + sse("state", doc)
    last_body = _json.encode({k: v for k, v in doc.items() if k not in ("at", "feed")})
    last_state = last_sent = time.monotonic()
    pending = False
    while True:
        now = time.monotonic()
        wait = KEEPALIVE_S - (now - last_sent)
        wait = min(wait, QUIET_S - (now - last_state))
        if pending:
            wait = min(wait, STATE_EVERY_S - (now - last_state))
        try:
            async with asyncio.timeout(max(wait, 0.0)):
                version = await watch.changed(version)
            pending = True
        except TimeoutError:
            pass
        out = [sse("feed", e) for e in watch.feed_since(rev)]
        if out:
            rev = watch.feed.rev
        now = time.monotonic()
        if now - last_state >= STATE_EVERY_S and (pending or now - last_state >= QUIET_S):
            doc = watch.snapshot(feed=False)
            body = _json.encode({k: v for k, v in doc.items() if k != "at"})
            if body != last_body:
                out.append(sse("state", doc))
                last_body = body
            last_state, pending = now, False
        if not out and now - last_sent >= KEEPALIVE_S:
            out.append(b": keep-alive\n\n")
        if out:
            last_sent = now
            yield b"".join(out)
