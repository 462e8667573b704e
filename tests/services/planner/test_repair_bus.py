"""The planner repairs the plan when telemetry calls a member down (a node killed with
SIGKILL says nothing), and takes it back when it is heard again: real processes on a
real nats-server."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client

from hecate.wire import subjects
from hecate.wire.messages import NodeEvent
from hecate_dev.apart import plan_nodes
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    start_swarm,
    wait_until_serving,
)
from tests.support.waits import until


def logged(processes: Processes, label: str, what: str) -> list[dict[str, object]]:
    return [
        record
        for line in processes.log(label).splitlines()
        if line.startswith("{") and (record := json.loads(line)).get("event") == what
    ]


EVERYONE = {n for n, *_ in SWARM_NODES}


async def planned_swarm(
    processes: Processes, client: Client
) -> Callable[[set[str]], Awaitable[bool]]:
    """The example swarm started and every node in its plan; whether the plan holds
    exactly a given set of nodes. A short retirement wait: what is under test is that
    it ends, not its length."""
    retire = ("--retire-after-ms", "1000")
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, planner_args=retire)

    async def planned(expected: set[str]) -> bool:
        return await plan_nodes(client) == expected

    await until(lambda: planned(EVERYONE), "every node in the plan", timeout=20)
    return planned


async def test_a_member_called_down_leaves_the_plan_and_comes_back_when_heard(
    processes: Processes, client: Client
) -> None:
    planned = await planned_swarm(processes, client)
    await wait_until_serving(client, "ncm-base")  # every node done loading its ranges
    # Frozen: silent, called down, out of the plan; thawed: heard again, back in it,
    # with no join (a frozen process never knew it was gone).
    pi = processes.procs["node-pi"]
    pi.send_signal(signal.SIGSTOP)
    try:
        await until(lambda: planned(EVERYONE - {"pi"}), "the plan without the frozen node")
    finally:
        pi.send_signal(signal.SIGCONT)
    await until(lambda: planned(EVERYONE), "the thawed node back in the plan")
    [out] = logged(processes, "planner", "node down: out of the plan")
    assert out["node_id"] == "pi"
    assert str(out["reason"]).startswith("silent for"), out
    assert [r["node_id"] for r in logged(processes, "planner", "node up: back in the plan")] == [
        "pi"
    ]
    # Killed: out again; restarted, it joins and is planned again.
    pi.send_signal(signal.SIGKILL)
    pi.wait()
    await until(lambda: planned(EVERYONE - {"pi"}), "the plan without the killed node")
    processes.node("pi", 4, 40.0, 0.5)
    await until(lambda: planned(EVERYONE), "the restarted node back in the plan", timeout=20)


async def test_a_down_read_after_the_up_that_followed_it_is_left_out(
    processes: Processes, client: Client
) -> None:
    """Telemetry's downs and ups come on two subjects, each read by a task of its own:
    a node called down and heard again a moment later may be read up first. The older
    word must not take it out of the plan for good."""
    planned = await planned_swarm(processes, client)
    now = time.time()
    up = NodeEvent(node_id="pi", state="up", reason="heartbeat", at=now)
    down = NodeEvent(node_id="pi", state="down", reason="silent for 500 ms", at=now - 0.03)
    await client.publish(subjects.EVENT_NODE_UP, msgspec.json.encode(up))
    await client.publish(subjects.EVENT_NODE_DOWN, msgspec.json.encode(down))
    await client.flush()
    await asyncio.sleep(2.5)  # past the retirement wait, twice over
    assert await planned(EVERYONE)
    assert logged(processes, "planner", "node down: out of the plan") == []
