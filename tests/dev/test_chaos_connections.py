"""The cluster scenario knows which nodes a server's death cuts off, from the server."""

from __future__ import annotations

import asyncio

from hecate.bus.server import NatsServer
from hecate.bus.service import connect
from hecate_dev.chaos.faults import nodes_connected_to


async def test_the_nodes_connected_to_a_server_are_read_from_its_connz(
    nats_server: NatsServer,
) -> None:
    node = await connect(nats_server.url, "hecate-node-a1-in")
    router = await connect(nats_server.url, "hecate-router-r1-out")
    try:
        found = await asyncio.to_thread(nodes_connected_to, nats_server.monitor_port)
    finally:
        await node.close()
        await router.close()
    assert found == {"a1"}
