"""A node answers a planner's roll-call with its join, as on start: a restarted planner
learns every running node this way."""

from __future__ import annotations

import asyncio
import logging

import msgspec
from nats.aio.client import Client

from hecate.bus.server import NatsServer
from hecate.core import NodeProfile
from hecate.wire import subjects
from hecate.wire.messages import NodeJoin
from hecate_node.config import NodeConfig
from hecate_node.service import Node

_join = msgspec.json.Decoder(NodeJoin)


async def test_a_roll_call_brings_the_join_again(nats_server: NatsServer, client: Client) -> None:
    joins = await client.subscribe(subjects.node_join("solo"))
    profile = NodeProfile(node_id="solo", capacity_layers=4, latency_ms=5.0)
    node = Node(NodeConfig(profile=profile, executor="null"), log=logging.getLogger("test.node"))
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(nats_server.url, stop, grace=1.0))
    try:
        first = _join.decode((await joins.next_msg(timeout=10)).data)
        assert (first.profile.node_id, first.executor, first.profile.executor) == (
            "solo",
            "null",
            "null",
        )
        await client.publish(subjects.NODE_ROLL_CALL, b"{}")  # what the planner sends
        again = _join.decode((await joins.next_msg(timeout=10)).data)
        assert again == first
        stats = {e.name: e for e in node.service.endpoints}
        assert stats["roll-call"].num_requests == 1
        assert stats["roll-call"].num_errors == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await joins.unsubscribe()
