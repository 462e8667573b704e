"""Who a process is on the bus: a NATS user and password, and the CA that signed the
server's TLS certificate.

They come from the environment (``HECATE_NATS_USER``, ``HECATE_NATS_PASSWORD``,
``HECATE_NATS_CA``), never from the command line, which every local user can read with
``ps``; a process's environment is readable only by its owner. Without them a process
connects anonymously, as on a development server with no authorization.

With a user, the connection's inboxes live under ``_INBOX.<user>``: the permissions in
``deploy/nats/`` let each user subscribe to its own inboxes only, so no tenant can read
another's replies, and let each service answer only the inboxes of the roles that ask it.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hecate.wire.subjects import inbox_prefix

ENV_USER = "HECATE_NATS_USER"
ENV_PASSWORD = "HECATE_NATS_PASSWORD"
ENV_CA = "HECATE_NATS_CA"
# One subject token: a slug, or node-<slug> for a node's user.
USER_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,68}$")


class CredentialsError(ValueError):
    """Credentials that cannot work (a user name that is not one subject token)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str = ""
    password: str = ""
    ca_file: str = ""  # PEM bundle to verify the server's certificate; "" = no TLS

    def __post_init__(self) -> None:
        if self.user and not USER_PATTERN.fullmatch(self.user):
            raise CredentialsError(
                f"NATS user {self.user!r} must match {USER_PATTERN.pattern} "
                "(it names the user's inboxes)"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials:
        env = os.environ if env is None else env
        return cls(
            user=env.get(ENV_USER, ""),
            password=env.get(ENV_PASSWORD, ""),
            ca_file=env.get(ENV_CA, ""),
        )

    def to_env(self) -> dict[str, str]:
        """The environment that gives a child process these credentials."""
        out = {ENV_USER: self.user, ENV_PASSWORD: self.password}
        if self.ca_file:
            out[ENV_CA] = self.ca_file
        return out

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.user)

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        opts: dict[str, Any] = {"inbox_prefix": self.inbox_prefix}
        if self.user:
            opts["user"] = self.user
            opts["password"] = self.password
        if self.ca_file:
            opts["tls"] = ssl.create_default_context(cafile=self.ca_file)
            _quiet_tls_close()
        return opts


class _TlsCloseNoise(logging.Filter):
    """asyncio warns on every TLS connection nats-py closes ("returning true from
    eof_received() has no effect when using ssl"): harmless, and one per CLI call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received()" not in record.getMessage()


def _quiet_tls_close() -> None:
    log = logging.getLogger("asyncio")
    if not any(isinstance(f, _TlsCloseNoise) for f in log.filters):
        log.addFilter(_TlsCloseNoise())
