"""A swarm on hosts really apart (network namespaces on one bridge,
:mod:`hecate_dev.hosts`): a NATS cluster of three servers, each on a host of its own;
the services on another; a rack of nodes on another; and a volunteer machine far away
whose nodes join through a NATS leaf node of its own. With requests flowing, the rack's
cable is pulled: every request is still answered, and right; the rack's nodes are called
down and routed around; the plan is repaired without them; and when the cable is back
they are heard again and planned again.

Needs root and iproute2 (``ip netns``): skipped, saying why, where they are not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.msg import Msg

from hecate.wire import subjects
from hecate.wire.messages import NodeEvent
from hecate_dev.apart import ApartSwarm, Load, alive, plan_nodes
from hecate_dev.hosts import unavailable
from tests.support.waits import until

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespaces: {WHY_NOT}")

RACK, FAR = 9, 3  # nodes of 8 layers, a model of 24: three copies in the rack, one far


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[ApartSwarm]:
    # A request may meet every copy the rack holds dead before the far one: it is allowed
    # one attempt more than that (the router's default, 3, is one short here).
    attempts = ("--max-attempts", str(RACK // 3 + 1))
    retire = ("--retire-after-ms", "1000")  # the wait's length is not under test here
    s = ApartSwarm(tmp_path, [RACK], far=FAR, router_args=attempts, planner_args=retire)
    try:
        yield s
    finally:
        s.close()


async def test_a_rack_cut_off_is_routed_around_and_planned_without_then_with(
    swarm: ApartSwarm,
) -> None:
    rack = swarm.rack_nodes(0, RACK)
    far = swarm.far_nodes(FAR)
    client = await nats.connect(swarm.url)
    downs: dict[str, float] = {}

    async def heard_down(msg: Msg) -> None:
        news = msgspec.json.decode(msg.data, type=NodeEvent)
        downs.setdefault(news.node_id, time.monotonic())

    async def planned(nodes: set[str]) -> bool:
        return await plan_nodes(client) == nodes

    try:
        await client.subscribe(subjects.EVENT_NODE_DOWN, cb=heard_down)

        async def formed() -> bool:
            return await planned(rack | far) and await alive(client) >= rack | far

        # The far nodes beat, read their shares and serve through their leaf node.
        await until(formed, "every node, the far ones through the leaf, alive and planned", 60)
        load = Load(client, swarm.model, swarm.layers)
        stop = asyncio.Event()
        flowing = asyncio.create_task(load.run(stop))
        try:
            await until(lambda: load.answered >= 20, "requests answered before the cut")
            cut_at = time.monotonic()
            swarm.racks[0].cut()
            await until(lambda: rack <= downs.keys(), "every rack node called down", 20)
            called = sorted(downs[n] - cut_at for n in rack)
            # 100 ms beats: about half a second each (the scale suite measures it).
            assert called[-1] < 5.0, called
            await until(lambda: planned(far), "the plan repaired without the rack", 20)
            before = load.answered
            await until(lambda: load.answered >= before + 20, "requests answered by the far copy")
            swarm.racks[0].heal()
            await until(lambda: planned(rack | far), "the rack planned again", 60)
        finally:
            stop.set()
            await flowing
        assert load.failed == 0, (load.errors[:3], load.errors[-3:])
        assert load.wrong == 0
        assert swarm.leaf is not None
        assert "JetStream using domains" in swarm.leaf.log
    finally:
        await client.close()
