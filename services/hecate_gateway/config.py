"""The gateway's settings: one validated struct, built by ``hecate gateway`` from its
flags. What it runs with (the keys, the logger, the tracer, the metrics registry) is
passed beside it, as objects rather than settings."""

from __future__ import annotations

import ipaddress
from typing import Literal

import msgspec

# Who may read the swarm page's data (/v1/swarm and its event stream): "key" asks for
# an API key, "open" lets anyone, "auto" asks for one unless the gateway listens on a
# loopback address only (where whoever reaches it is on this machine).
PageAuth = Literal["auto", "key", "open"]
PAGE_AUTH: tuple[PageAuth, ...] = ("auto", "key", "open")


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``port`` 0 listens on any free port (the one chosen is logged). ``timeout_s`` is
    how long a request may wait for the swarm's answer; ``grace_s`` how long answers in
    progress at shutdown get to finish. Raises ``ValueError`` naming the field."""

    host: str = "127.0.0.1"
    port: int = 8000
    timeout_s: float = 300.0
    grace_s: float = 10.0
    # A directory of <tenant>.env files: each key's tenant asks with its own bus
    # identity (identities.py). "": every request goes on the gateway's own connection.
    tenant_identities: str = ""
    page_auth: PageAuth = "auto"
    # Live event streams of the swarm page open at once; one more is refused (429): each
    # holds a task and a socket for as long as its client stays.
    max_page_streams: int = 64
    # A file the gateway writes its URL into once it listens (and removes when it
    # stops), for whoever started it on port 0: "" writes none.
    url_file: str = ""
    # Connections (or requests in progress) at once; a request beyond is answered 503.
    # Each holds a socket, a file descriptor and buffers: within common fd limits.
    max_connections: int = 1000
    # How long a request's headers may take to arrive whole, from their first byte (a
    # new connection's opening): a connection that sends half a header is closed then,
    # rather than held for good.
    header_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host: must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be 0 to 65535, got {self.port}")
        if not self.timeout_s > 0:
            raise ValueError(
                f"timeout_s: must be a positive number of seconds, got {self.timeout_s}"
            )
        if self.page_auth not in PAGE_AUTH:
            raise ValueError(
                f"page_auth: must be one of {', '.join(PAGE_AUTH)}, got {self.page_auth!r}"
            )
        if not self.max_page_streams >= 1:
            raise ValueError(f"max_page_streams: must be at least 1, got {self.max_page_streams}")
        if not self.max_connections >= 1:
            raise ValueError(f"max_connections: must be at least 1, got {self.max_connections}")
        if not self.header_timeout_s > 0:
            raise ValueError(
                f"header_timeout_s: must be a positive number of seconds, "
                f"got {self.header_timeout_s}"
            )
        # uvicorn takes whole seconds; less than one would give no grace at all.
        if not self.grace_s >= 1:
            raise ValueError(f"grace_s: must be at least 1 second, got {self.grace_s}")

    @property
    def page_needs_key(self) -> bool:
        """Whether the swarm page's data asks for an API key (see :data:`PageAuth`)."""
        if self.page_auth != "auto":
            return self.page_auth == "key"
        return not is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``); a wildcard
    (``0.0.0.0``, ``::``) or any other name listens beyond it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
