"""A locked-down bus in tests: its server, and logging in as one of its users.

Shared by the tests of permissions, node identities, the account-per-tenant layout and
fuzzing: each starts a server with :func:`secure_server` and logs in through
:func:`sessions`, whose :class:`Session` keeps the permission violations the server sent
that user; :func:`publishers` says who may send on a subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import Client

from hecate.bus.secure import Layout, SecureBus
from hecate.bus.server import NatsServer
from hecate.wire import permissions, subjects
from tests.support.swarm import Processes, start_swarm


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


def start_accounts_swarm(
    procs: Processes, topology: Path, nodes: list[tuple[str, int, float, float]]
) -> None:
    """:func:`~.conftest.start_swarm`'s toy swarm, one router, on the layout with an
    account per tenant (``procs`` logging each service in as itself): the router reads
    each request's tenant from the account the server names."""
    start_swarm(procs, topology, nodes, routers=0)
    procs.start(
        "router-1",
        "router",
        *("--id", "router-1", "--topology", str(topology), "--stage-timeout-ms", "1500"),
        *("--dispatch", "hop", "--stale-ms", "500", "--tenant-from", "bus"),
    )


def publishers(bus: SecureBus, subject: str, layout: Layout = "authorization") -> list[str]:
    """The users of ``bus`` whose permissions in ``layout`` let them publish on
    ``subject``, as the wire contract derives them: the least trusted first (tenants,
    then the service roles, the nodes, the gateway and the operator)."""
    if layout == "accounts":
        granted = {
            user: perms
            for account in permissions.accounts(bus.tenants, bus.nodes).values()
            for user, perms in account.users.items()
        }
    else:
        granted = permissions.users(bus.tenants, bus.nodes)
    return [u for u in everyone(bus) if permissions.allows(granted[u].publish, subject)]


def everyone(bus: SecureBus) -> list[str]:
    """Every user of ``bus``, the least trusted first: the tenants, the service roles,
    the nodes, the gateway and the operator."""
    return [
        *bus.tenants,
        *permissions.SERVICE_USERS,
        *(permissions.node_user(n) for n in bus.nodes),
        permissions.GATEWAY,
        permissions.OPERATOR,
    ]


def delivered_on(subject: str) -> str:
    """Where the server delivers what is published to ``subject``: a heartbeat on its
    intake partition (subjects.MAPPINGS), anything else where it was sent."""
    node = subjects.node_of(subject)
    return subjects.intake("*", node) if node and ".heartbeat." in subject else subject


def refused_as(subject: str) -> re.Pattern[str]:
    """What the server's refusal names: the subject it checked, which is the mapped one
    in an account that maps it (the services'), the one sent in any other (a tenant's)."""
    said = [subject, delivered_on(subject)]
    forms = "|".join(re.escape(s).replace(r"\*", "[0-9]+") for s in said)
    return re.compile(f'publish to "({forms})"', re.IGNORECASE)
