"""Connecting to NATS: retried until a deadline at start, then reconnecting forever."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client

from hecate.bus.credentials import Credentials
from hecate.core.errors import HecateError

__all__ = ["BusUnreachable", "connect", "one_order"]

_log = logging.getLogger("hecate.bus")


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
    in_order: bool = False,
) -> Client:
    """Connect, retrying until ``timeout`` (services may start before the server); once
    connected, reconnect forever. Credentials come from the environment unless given
    (see :mod:`hecate.bus.credentials`).

    ``url`` may list a cluster's servers (``a,b,c``): nats-py picks one at random, and
    another at random on each reconnect, unless ``in_order``: then it takes them in the
    order given, moving to the next one when it loses one (see :func:`one_order`)."""
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
                    servers(url),
                    name=name,
                    dont_randomize=in_order,
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


def servers(url: str) -> list[str]:
    """The servers ``url`` lists (a cluster: ``a,b,c``)."""
    return [u.strip() for u in url.split(",") if u.strip()]


def one_order(url: str, rng: random.Random | None = None) -> str:
    """``url``'s servers shuffled once, for the connections of one process to take in
    that order (``connect(..., in_order=True)``).

    A process's connections then share a server, and on losing it move to the same
    next one: a cut of that server cuts all of them at once, and a peer that hears the
    process on one connection can reach it on the others. Left to pick at random, a
    node's serving connection could sit behind a cut server while its heartbeats, on
    another connection, still reach telemetry: alive to the swarm, unreachable to
    every router. The shuffle spreads processes over the cluster as nats-py's would."""
    urls = servers(url)
    (rng or random).shuffle(urls)
    return ",".join(urls)


class BusUnreachable(HecateError):
    """No connection to NATS in time (server down, credentials refused, TLS failed)."""

    code = "nats_unreachable"
