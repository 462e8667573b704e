"""The ``hecate gateway`` process: one NATS connection, the swarm watch, the HTTP server.

Reads like its table of contents: connect to NATS; follow the swarm (:class:`SwarmWatch`,
whose collector adds the swarm gauges to ``/metrics``); serve the app with uvicorn until
SIGTERM/SIGINT; then stop taking connections, let answers in progress finish (bounded),
and drain the bus connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path

import uvicorn
from nats.aio.client import Client
from opentelemetry.trace import TracerProvider
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hecate.bus.logs import event
from hecate.bus.service import connect
from hecate.core.errors import HecateError
from hecate_gateway.app import Gateway, build_app
from hecate_gateway.bridge import Bridge
from hecate_gateway.config import GatewayConfig
from hecate_gateway.identities import TenantLinks
from hecate_gateway.keys import Auth
from hecate_gateway.metrics import METRICS, Metrics
from hecate_gateway.swarm import SwarmWatch


class GatewayService:
    """``config`` is what it is set to; the rest is what it runs with."""

    def __init__(
        self,
        *,
        config: GatewayConfig,
        auth: Auth,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
        metrics: Metrics = METRICS,
    ) -> None:
        self.config = config
        self.auth = auth
        self.log = log
        self.tracer_provider = tracer_provider
        self.metrics = metrics

    async def run(self, url: str, stop: asyncio.Event) -> None:
        nc = await connect(url, "hecate-gateway")
        identities = self.config.tenant_identities
        links = TenantLinks(
            nc, url=url, directory=Path(identities) if identities else None, log=self.log
        )
        watch = SwarmWatch(log=self.log)
        watch.register_metrics(self.metrics.registry)
        following = asyncio.create_task(self._follow(watch, nc))
        app = build_app(
            Gateway(
                bridge=Bridge(nc, links=links, timeout_s=self.config.timeout_s),
                auth=self.auth,
                watch=watch,
                metrics=self.metrics,
                log=self.log,
                tracer_provider=self.tracer_provider,
                page_needs_key=self.config.page_needs_key,
                max_page_streams=self.config.max_page_streams,
            )
        )
        server = uvicorn.Server(server_config(app, self.config))
        sock = listen(
            self.config.host, self.config.port
        )  # bound here: port 0's choice is known at once
        host, port = sock.getsockname()[:2]
        # Server.serve() would take over SIGTERM/SIGINT and raise them again on exit;
        # this process handles its own signals (stop), so it runs the inner loop.
        serving = asyncio.create_task(server._serve(sockets=[sock]))
        url_file = Path(self.config.url_file) if self.config.url_file else None
        if url_file is not None:
            write_url(url_file, f"http://{host}:{port}")
        event(
            self.log,
            "listening",
            url=f"http://{host}:{port}/v1",
            host=host,
            port=port,
            page_needs_key=self.config.page_needs_key,
        )
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({stopping, serving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if url_file is not None:
                url_file.unlink(missing_ok=True)
            stopping.cancel()
            server.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
            await links.close()
            await nc.drain()
            event(self.log, "stopped")

    async def _follow(self, watch: SwarmWatch, nc: Client) -> None:
        """Follow the swarm for the gateway's life: a watch that fails (a bucket deleted
        under it, a permission it lacks) is logged and started again, never left dead
        behind a page and a /v1/models that would stop changing."""
        while True:
            try:
                await watch.run(nc)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("swarm watch failed; following again in 1 s")
            await asyncio.sleep(1.0)


def server_config(app: ASGIApp, config: GatewayConfig) -> uvicorn.Config:
    """How uvicorn serves the gateway: bounded in connections and in how long a request's
    headers may take (:class:`HeaderDeadline`)."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=int(config.grace_s),
        limit_concurrency=config.max_connections,
        http=header_deadline(config.header_timeout_s),
    )


class HeaderDeadline(HttpToolsProtocol):
    """uvicorn's HTTP protocol (httptools), closing a connection whose request's headers
    are not whole within :attr:`header_timeout_s` of their first byte, or of the
    connection's opening for its first request. uvicorn times a connection out only
    when it idles between requests: one that sent half a header was held for good, and
    with it a place under ``limit_concurrency``. The deadline does not move with each
    byte, so a header sent a byte at a time is no slower to close."""

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:  # a next request on a kept-alive connection
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def header_deadline(seconds: float) -> type[HeaderDeadline]:
    """:class:`HeaderDeadline` with its timeout: uvicorn makes each connection's
    protocol from a class, with no say in its arguments."""

    class Bound(HeaderDeadline):
        header_timeout_s = seconds

    return Bound


def write_url(path: Path, url: str) -> None:
    """``url`` and a newline into ``path``, whole or not at all: a reader polling for
    the file never sees half an address."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(url + "\n")
    partial.replace(path)


#: Connections the kernel holds for the server before it accepts them (uvicorn's own).
BACKLOG = 2048


def listen(host: str, port: int) -> socket.socket:
    """A socket bound and listening for the server; a port in use is a
    :class:`HecateError`. Listening from here, before uvicorn starts: the "listening"
    line is logged at once, and a client that reads it and connects while the server
    still starts (its lifespan, on a loaded machine) waits in the backlog instead of
    being refused."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise HecateError(f"gateway: cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock
