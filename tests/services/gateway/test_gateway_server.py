"""The gateway's server over real sockets: a connection that sends half a header (or
nothing, or a header a byte at a time) is closed at its deadline; past its connections
a request is answered 503; and a burst of page event streams beyond their cap is refused
past the cap, counted as each is accepted rather than once its body begins."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from hecate_gateway import page
from hecate_gateway.config import GatewayConfig
from hecate_gateway.service import HeaderDeadline, server_config
from hecate_gateway.swarm import SwarmWatch
from tests.support.waits import until


async def live(_request: Request) -> Response:
    return JSONResponse({"live": True})


def app_with_page(max_streams: int = page.MAX_STREAMS) -> Starlette:
    routes = [Route("/healthz/live", live), *page.routes(SwarmWatch(), max_streams=max_streams)]
    return Starlette(routes=routes)


@contextlib.asynccontextmanager
async def serving(app: Starlette, **settings: float) -> AsyncIterator[tuple[str, int]]:
    """``app`` as the gateway serves it (its uvicorn settings, from a config with
    ``settings``), in this event loop, on a free port: (host, port)."""
    config = GatewayConfig(port=0, grace_s=1, **settings)  # type: ignore[arg-type]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    host, port = sock.getsockname()
    server = uvicorn.Server(server_config(app, config))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: server.started or task.done(), "uvicorn listening")
        assert not task.done(), task
        yield host, port
    finally:
        server.should_exit = True
        await task
        sock.close()


async def closed_after(reader: asyncio.StreamReader, limit_s: float) -> tuple[bytes, float]:
    """What the server sent before closing, and how long it took to close."""
    started = time.monotonic()
    got = b""
    async with asyncio.timeout(limit_s):
        while chunk := await reader.read(4096):
            got += chunk
    return got, time.monotonic() - started


# -- a request's headers have a deadline -------------------------------------------------


async def test_a_connection_that_sends_half_a_header_is_closed_at_the_header_timeout() -> None:
    async with serving(app_with_page(), header_timeout_s=0.5) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz/live HTTP/1.1\r\nHost: gateway\r\nX-Half: ")
        await writer.drain()
        got, took = await closed_after(reader, limit_s=5.0)
        assert got == b""
        assert 0.3 < took < 3.0, took
        writer.close()


async def test_a_silent_connection_and_a_trickled_header_are_closed_at_the_deadline() -> None:
    """The deadline runs from the connection's opening (or a request's first byte) and
    does not move with each byte: a header sent a byte at a time gains nothing."""
    async with serving(app_with_page(), header_timeout_s=0.5) as (host, port):
        silent_reader, silent = await asyncio.open_connection(host, port)
        trickle_reader, trickle = await asyncio.open_connection(host, port)
        started = time.monotonic()
        for byte in b"GET /healthz/live HTTP/1.1\r\nHost: gateway\r\n":
            if trickle_reader.at_eof() or trickle.is_closing():
                break
            trickle.write(bytes([byte]))
            with contextlib.suppress(ConnectionError):
                await trickle.drain()
            await asyncio.sleep(0.05)
            if time.monotonic() - started > 4.0:
                break
        got, _ = await closed_after(trickle_reader, limit_s=5.0)
        assert got == b""
        assert time.monotonic() - started < 3.0
        assert (await closed_after(silent_reader, limit_s=5.0))[0] == b""
        silent.close()
        trickle.close()


async def test_whole_requests_are_served_and_a_kept_connection_gets_a_fresh_deadline() -> None:
    async with serving(app_with_page(), header_timeout_s=0.5) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(3):  # each request well within its deadline, the whole well past it
            writer.write(b"GET /healthz/live HTTP/1.1\r\nHost: gateway\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert await reader.readexactly(length) == b'{"live":true}'
            await asyncio.sleep(0.3)
        writer.close()


# -- connections are bounded ----------------------------------------------------------------


async def test_a_request_past_max_connections_is_a_503_and_served_once_they_go() -> None:
    async with serving(app_with_page(), max_connections=3, header_timeout_s=30) as (host, port):
        held = [await asyncio.open_connection(host, port) for _ in range(3)]
        await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
            assert (await http.get("/healthz/live")).status_code == 503
        for _, writer in held:
            writer.close()
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
            for _ in range(100):
                if (await http.get("/healthz/live")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("closed connections never gave their places back")


def test_the_server_settings_come_from_the_config() -> None:
    config = server_config(app_with_page(), GatewayConfig(max_connections=7, header_timeout_s=3))
    assert config.limit_concurrency == 7
    assert isinstance(config.http, type)
    assert issubclass(config.http, HeaderDeadline)
    assert config.http.header_timeout_s == 3


# -- page event streams: the cap holds in a burst -------------------------------------------


def _events_endpoint(max_streams: int) -> Callable[[Request], Awaitable[Response]]:
    routes = page.routes(SwarmWatch(), max_streams=max_streams)
    return next(r.endpoint for r in routes if isinstance(r, Route) and r.name == "swarm_events")


SCOPE = {"type": "http", "method": "GET", "path": "/v1/swarm/events", "headers": []}


async def test_a_burst_of_streams_past_the_cap_is_refused_before_any_begins() -> None:
    """Every request of the burst is answered before any stream's body begins (as a
    server answers requests that came together): the cap counts them as accepted."""
    events = _events_endpoint(max_streams=4)
    answers = await asyncio.gather(*(events(Request(SCOPE)) for _ in range(20)))
    assert [r.status_code for r in answers].count(200) == 4
    assert [r.status_code for r in answers].count(429) == 16

    # A stream whose client left before its body began gives its place back.
    async def gone() -> Message:
        return {"type": "http.disconnect"}

    async def send(_message: Message) -> None:
        await asyncio.sleep(0)

    await answers[0](SCOPE, gone, send)
    again = await events(Request(SCOPE))
    assert again.status_code == 200
    assert (await events(Request(SCOPE))).status_code == 429


@pytest.mark.parametrize("burst", [40])
async def test_a_burst_over_sockets_gets_the_cap_and_429s(burst: int) -> None:
    async with serving(app_with_page(max_streams=4)) as (host, port):
        limits = httpx.Limits(max_connections=burst)
        async with httpx.AsyncClient(
            base_url=f"http://{host}:{port}", limits=limits, timeout=10
        ) as http:

            async def status() -> int:
                async with http.stream("GET", "/v1/swarm/events") as r:
                    code = r.status_code
                    if code == 200:
                        await asyncio.sleep(0.5)  # held open while the rest arrive
                    return code

            codes = await asyncio.gather(*(status() for _ in range(burst)))
        assert codes.count(200) <= 4, codes
        assert codes.count(429) >= burst - 4
