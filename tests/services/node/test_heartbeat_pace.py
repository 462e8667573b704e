"""A node slows its beats as the plan says the swarm grew, saying so in its beats, and a
real telemetry service keeps it alive through the change (a real nats-server; telemetry
as a process)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client

from hecate.bus.server import NatsServer
from hecate.core import ModelSpec, NodeProfile, SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import Heartbeat
from hecate_node.config import NodeConfig
from hecate_node.service import Node
from hecate_planner.planstore import publish_by_hand
from tests.support.swarm import Processes, start_planner
from tests.support.waits import until

# Judged by the wall clock (how soon, how long): run alone, after the parallel tests.
pytestmark = pytest.mark.serial


def _swarm_of(nodes: int) -> SwarmPlan:
    profiles = tuple(NodeProfile(node_id=f"n{i:04d}", capacity_layers=4) for i in range(nodes))
    return SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id="toy", layers=4),),
        nodes=(NodeProfile(node_id="pacer", capacity_layers=4), *profiles),
        pipelines=(),
    )


async def test_a_node_of_a_large_swarm_beats_slower_says_so_and_stays_alive(
    nats_server: NatsServer, client: Client, processes: Processes
) -> None:
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    beats = await client.subscribe(subjects.intake("*", "pacer"))
    downs = await client.subscribe(subjects.EVENT_NODE_DOWN)
    await publish_by_hand(client, _swarm_of(8))
    config = NodeConfig(
        profile=NodeProfile(node_id="pacer", capacity_layers=4),
        heartbeat_s=0.1,
        heartbeat_budget_per_s=400.0,  # 400 beats a second: 40 nodes at 100 ms
        heartbeat_most_s=1.0,
    )
    node = Node(config, log=logging.getLogger("test.pace"))
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(nats_server.url, stop, grace=1.0))
    try:
        await until(lambda: node.holdings.swarm_nodes == 9, "the small plan held")
        first = msgspec.json.decode((await beats.next_msg(timeout=5)).data, type=Heartbeat)
        assert first.interval_ms == 100.0
        await asyncio.sleep(1.0)  # telemetry learns the 100 ms pace

        await publish_by_hand(client, _swarm_of(199))
        await until(lambda: node.holdings.swarm_nodes == 200, "the large plan held")
        assert node.beat_s == 0.5  # 200 nodes at 400 beats a second
        await beats.unsubscribe()
        beats = await client.subscribe(subjects.intake("*", "pacer"))  # from now on
        declared: list[float] = []
        arrived: list[float] = []
        loop = asyncio.get_running_loop()
        while len(arrived) < 6:
            msg = await beats.next_msg(timeout=5)
            declared.append(msgspec.json.decode(msg.data, type=Heartbeat).interval_ms)
            arrived.append(loop.time())
        assert declared[-1] == 500.0
        gaps = [b - a for a, b in zip(arrived[-4:], arrived[-3:], strict=False)]
        assert all(0.4 < g < 0.7 for g in gaps), gaps
        assert downs.pending_msgs == 0, "telemetry called the slower node down"
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_nodes_pace_by_the_members_before_there_is_any_plan(
    nats_server: NatsServer, processes: Processes, tmp_path: Path
) -> None:
    """A swarm forming has no plan yet (here it never will: too little capacity), but
    the planner says how many members it has heard, and the nodes slow down by it: a
    thousand nodes beating at the pace of a few would overrun their machines first."""
    topology = tmp_path / "topology.json"
    topology.write_text(
        json.dumps(
            {"models": [{"id": "big", "layers": 400}], "nodes": [{"id": "x", "capacity_layers": 4}]}
        )
    )
    start_planner(processes, topology, 1, extra=("--remind-ms", "200"))
    nodes = [
        Node(
            NodeConfig(
                profile=NodeProfile(node_id=f"member{i}", capacity_layers=4),
                heartbeat_s=0.1,
                heartbeat_budget_per_s=10.0,  # 3 nodes: one beat every 0.3 s each
                heartbeat_most_s=1.0,
            ),
            log=logging.getLogger("test.pace"),
        )
        for i in range(3)
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(n.run(nats_server.url, stop, grace=1.0)) for n in nodes]
    try:
        await until(
            lambda: all(n.holdings.swarm_nodes == 3 for n in nodes),
            "every node told of the three members",
            timeout=15,
            last=str([n.holdings.swarm_nodes for n in nodes]),
        )
        assert all(n.beat_s == pytest.approx(0.3) for n in nodes)
        assert all(n.holdings.epoch == 0 and n.holdings.held == [] for n in nodes)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
