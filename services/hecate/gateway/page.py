"""The live swarm page and its data: ``GET /`` (one HTML file shipped with the package:
inline CSS and JS, no CDN, nothing to build), ``GET /v1/swarm`` (the state as JSON, its
shape in :mod:`hecate.gateway.swarm`) and ``GET /v1/swarm/events`` (Server-Sent Events).

The event stream sends, as ``event: state``, the whole state (feed included) on
connect, then the state without its feed whenever it changed, at most every
``STATE_EVERY_S`` (telemetry rewrites itself ten times a second; a page redrawn at that
rate helps nobody); and, as ``event: feed``, each new or changed feed line as soon as it
arrives. A quiet swarm still gets a state every ``QUIET_S`` (tokens/s decays by itself)
and the connection a comment every ``KEEPALIVE_S`` (proxies drop silent streams).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from hecate.gateway.swarm import SwarmWatch

STATE_EVERY_S = 0.2
QUIET_S = 1.0
KEEPALIVE_S = 15.0

PAGE = Path(__file__).with_name("static") / "index.html"
_json = msgspec.json.Encoder()


def routes(watch: SwarmWatch) -> list[BaseRoute]:
    """The page's routes, to mount on the gateway's app."""
    page = PAGE.read_bytes()  # read once: a page edited under a running gateway is not served

    async def index(_request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    async def state(_request: Request) -> Response:
        return Response(
            _json.encode(watch.snapshot()),
            media_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def events(_request: Request) -> Response:
        return StreamingResponse(
            stream(watch),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return [
        Route("/", index, methods=["GET"], name="swarm_page"),
        Route("/v1/swarm", state, methods=["GET"], name="swarm_state"),
        Route("/v1/swarm/events", events, methods=["GET"], name="swarm_events"),
    ]


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
