"""The gateway's settings: one validated struct, built by ``hecate gateway`` from its
flags. What it runs with (the keys, the logger, the tracer, the metrics registry) is
passed beside it, as objects rather than settings."""

from __future__ import annotations

import msgspec


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

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host: must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be 0 to 65535, got {self.port}")
        if not self.timeout_s > 0:
            raise ValueError(
                f"timeout_s: must be a positive number of seconds, got {self.timeout_s}"
            )
        # uvicorn takes whole seconds; less than one would give no grace at all.
        if not self.grace_s >= 1:
            raise ValueError(f"grace_s: must be at least 1 second, got {self.grace_s}")
