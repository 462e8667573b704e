"""Connecting to NATS: retried until a deadline at start, then reconnecting forever."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client

from hecate.bus.credentials import Credentials
from hecate.core.errors import HecateError

__all__ = ["BusUnreachable", "connect"]

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
