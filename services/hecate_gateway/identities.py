"""The gateway acts for a key's tenant with that tenant's own bus identity.

On a bus with one NATS account per tenant, a router takes a request's tenant from the
account the server vouches for (``hecate router --tenant-from bus``), so the gateway
must ask as the tenant, not as itself: :class:`TenantLinks` keeps one connection per
tenant, opened on first use with the credentials in ``<directory>/<tenant>.env`` (the
files ``hecate up --secure`` writes: ``export HECATE_NATS_USER=...`` lines). A key can
then only ever act as its own tenant: the bus says so, whatever the body claims.

Without a directory every tenant's requests go on the gateway's own connection, and the
body's ``tenant`` field is what names it (an open bus, or one account for everybody).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Client

from hecate.bus.credentials import Credentials, CredentialsError
from hecate.bus.logs import event
from hecate.bus.service import connect
from hecate.wire import subjects


class NoIdentity(Exception):
    """The gateway holds no bus identity for this tenant; ``str()`` says why."""


def read_env_file(path: Path) -> dict[str, str]:
    """``export KEY=VALUE`` (or ``KEY=VALUE``) lines; blank lines and ``#`` comments
    are skipped. Values are taken as written (no quoting)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def without_userinfo(url: str) -> str:
    """The server list with any ``user:password@`` taken out: a tenant's connection
    must log in as the tenant, never with the gateway's own URL credentials."""
    out = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        host = parts.netloc.rpartition("@")[2]
        out.append(urlunsplit(parts._replace(netloc=host)))
    return ",".join(out)


class TenantLinks:
    def __init__(
        self,
        own: Client,
        *,
        url: str = "",
        directory: Path | None = None,
        log: logging.Logger | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.own = own
        self.url = url
        self.directory = directory
        self.log = log or logging.getLogger("hecate_gateway")
        self.connect_timeout_s = connect_timeout_s
        self._links: dict[str, Client] = {}
        self._opening: dict[str, asyncio.Lock] = {}

    async def client(self, tenant: str) -> Client:
        """The connection that asks as ``tenant``. Raises :class:`NoIdentity`."""
        if self.directory is None:
            return self.own
        link = self._links.get(tenant)
        if link is not None and not link.is_closed:
            return link
        async with self._opening.setdefault(tenant, asyncio.Lock()):
            link = self._links.get(tenant)
            if link is None or link.is_closed:
                link = await self._open(tenant, self.directory)
                self._links[tenant] = link
        return link

    async def _open(self, tenant: str, directory: Path) -> Client:
        if not subjects.SLUG.fullmatch(tenant):
            raise NoIdentity(f"tenant {tenant!r} is not a name an identity file can have")
        path = directory / f"{tenant}.env"
        try:
            creds = Credentials.from_env(read_env_file(path))
        except (OSError, CredentialsError) as exc:
            why = f"the gateway holds no bus identity for tenant {tenant!r}: {exc}"
            raise NoIdentity(why) from None
        if creds.user != tenant:
            why = f"{path} is the identity of {creds.user!r}, not of tenant {tenant!r}"
            raise NoIdentity(why)
        try:
            link = await connect(
                without_userinfo(self.url),
                f"hecate-gateway-{tenant}",
                timeout=self.connect_timeout_s,
                credentials=creds,
            )
        except Exception as exc:
            raise NoIdentity(f"the bus refused tenant {tenant!r}'s identity: {exc}") from None
        event(self.log, "tenant identity connected", tenant=tenant)
        return link

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            with contextlib.suppress(Exception):
                await link.drain()
