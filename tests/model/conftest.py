"""The integration fixtures (a real nats-server per test, services as processes)."""

from ..integration.conftest import client, nats_server, processes

__all__ = ["client", "nats_server", "processes"]
