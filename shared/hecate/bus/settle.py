"""Everything sent so far has reached the server: what ``Client.flush`` promises, kept.

nats-py (2.16) writes a flush's PING straight to the socket, ahead of the commands still
waiting in its pending buffer for the flusher task: a subscription made just before
(``subscribe`` only queues its SUB) reaches the server *after* the PING, so the PONG can
come back, and ``flush`` return, before the server has read the SUB. A request another
connection sends in that moment finds nobody listening: under load, about one first
request in sixty across a tenant's import was answered "no responders" by a router whose
``subscribe`` and ``flush`` had both returned. :func:`settled` pushes the pending buffer
out first (and waits until the flusher has written it), then flushes.

A ``flush`` that is cancelled (its task stopped, a timeout around it) leaves its cancelled
future in the client's queue of PONGs awaited; the PONG that comes for it then raises
``InvalidStateError`` inside nats-py's read loop, which takes the connection down and
reconnects (a test stopping a heartbeat task mid-flush saw its next request fail). So
the PING's future here is shielded: a caller that gives up leaves it to be resolved.
"""

from __future__ import annotations

import asyncio

from nats import errors
from nats.aio.client import Client

__all__ = ["settled"]


async def settled(nc: Client, timeout: int = 10) -> None:
    """Return once the server has read every command sent on ``nc`` before the call.
    Raises nats-py's ``FlushTimeoutError`` (no PONG within ``timeout``) and
    ``ConnectionClosedError``, as ``flush`` does."""
    if nc.is_closed:
        raise errors.ConnectionClosedError
    await nc._flush_pending(force_flush=True)  # the pending SUBs and PUBs, written
    pong: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    await nc._send_ping(pong)
    try:
        await asyncio.wait_for(asyncio.shield(pong), timeout)
    except TimeoutError:
        raise errors.FlushTimeoutError from None
