"""A locked-down bus in tests: its server, and logging in as one of its users.

Shared by the tests of permissions, node identities and the account-per-tenant layout:
each starts a server with :func:`secure_server` and logs in through :func:`sessions`,
whose :class:`Session` keeps the permission violations the server sent that user.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import Client

from hecate.bus.secure import Layout, SecureBus
from hecate.bus.server import NatsServer


def secure_server(path: Path, bus: SecureBus, layout: Layout = "authorization") -> NatsServer:
    """A started server with ``bus``'s users in ``layout`` (stop it when done)."""
    return NatsServer(
        path, extra_config=bus.server_config(layout=layout), env=bus.server_env()
    ).start()


@dataclass
class Session:
    """One user's connection and the permission errors the server sent it."""

    nc: Client
    errors: list[str]

    async def refused(self, timeout: float = 2.0) -> str:
        for _ in range(int(timeout / 0.02)):
            if self.errors:
                return self.errors.pop(0)
            await asyncio.sleep(0.02)
        raise AssertionError("the server did not refuse")


Login = Callable[[str], Awaitable[Session]]


@contextlib.asynccontextmanager
async def sessions(url: str, bus: SecureBus) -> AsyncIterator[Login]:
    """``login(user)`` connects as ``user``; every session is closed on the way out."""
    opened: list[Session] = []

    async def login(user: str) -> Session:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            if "permissions violation" in str(exc).lower():
                errors.append(str(exc))

        nc = await nats.connect(url, error_cb=on_error, **bus.credentials(user).options())
        opened.append(Session(nc, errors))
        return opened[-1]

    try:
        yield login
    finally:
        for s in opened:
            await s.nc.close()
