"""Faults with real processes: kill -9 means kill -9."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.core import SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent, TelemetrySnapshot

from .conftest import EXAMPLES, SWARM_NODES, Processes, infer, start_swarm, wait_until_serving
from .load import run_load


async def telemetry(nc: Client) -> TelemetrySnapshot:
    kv = await kvs.bucket(nc, subjects.TELEMETRY_BUCKET)
    entry = await kv.get(subjects.TELEMETRY_KEY)
    return msgspec.json.decode(entry.value or b"", type=TelemetrySnapshot)


async def plan(nc: Client) -> tuple[SwarmPlan, int]:
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    entry = await kv.get(subjects.PLAN_KEY)
    return msgspec.json.decode(entry.value or b"", type=SwarmPlan), int(entry.revision or 0)


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> float:
    """Seconds until the async ``predicate()`` holds."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await predicate():
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout}s")


async def test_sigkill_a_node_under_load_loses_nothing_and_the_swarm_heals(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=2)
    first = await wait_until_serving(client, "ncm-base")
    assert first.route is not None
    victim = first.route.stages[0].node_id  # on the cheapest pipeline: it carries the load
    events: list[FailoverEvent] = []

    async def on_failover(msg: Msg) -> None:
        events.append(msgspec.json.decode(msg.data, type=FailoverEvent))

    sub = await client.subscribe(subjects.EVENT_FAILOVER, cb=on_failover)

    stop = asyncio.Event()
    load = asyncio.create_task(run_load(client, "ncm-base", 12, stop, workers=4))
    await asyncio.sleep(0.5)
    processes.kill(f"node-{victim}", signal.SIGKILL)

    async def victim_down() -> bool:
        snap = await telemetry(client)
        return not snap.nodes[victim].alive

    detected = await wait_for(victim_down, 5)
    await asyncio.sleep(0.5)
    processes.node(victim, *next((c, lat, s) for n, c, lat, s in SWARM_NODES if n == victim))

    async def victim_up() -> bool:
        snap = await telemetry(client)
        return snap.nodes[victim].alive

    await wait_for(victim_up, 10)
    await asyncio.sleep(0.3)
    stop.set()
    tally = await load
    await sub.unsubscribe()

    assert tally.lost == 0, tally
    assert tally.wrong == 0, tally
    assert tally.errors == 0, tally  # an intact replica existed all along
    assert tally.ok > 20, tally
    assert detected < 1.0, f"node death noticed after {detected:.2f}s"
    mine = [e for e in events if e.lost_node == victim]
    assert mine, "a failover event was published"
    assert {e.kind for e in mine} == {"replica"}
    assert all(
        e.new_route is not None and victim not in [s.node_id for s in e.new_route.stages]
        for e in mine
    )
    # Healthy again: every planned pipeline intact, and the victim carries traffic again.
    snap = await telemetry(client)
    current, _ = await plan(client)
    assert all(snap.nodes[s.node_id].alive for p in current.pipelines for s in p.stages)

    async def victim_serves() -> bool:
        reply = await infer(client, "ncm-base", "after the storm")
        return (
            reply.ok
            and reply.route is not None
            and victim in [s.node_id for s in reply.route.stages]
        )

    await wait_for(victim_serves, 5)


async def test_killing_a_router_replica_leaves_the_other_serving(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=2)
    await wait_until_serving(client, "ncm-base")
    stop = asyncio.Event()
    load = asyncio.create_task(run_load(client, "ncm-base", 12, stop, workers=4, timeout=1.0))
    await asyncio.sleep(0.5)
    processes.kill("router-1", signal.SIGKILL)
    await asyncio.sleep(1.5)
    stop.set()
    tally = await load
    # A request a SIGKILLed router had taken gets no reply; the client re-sends it after
    # its timeout and the surviving replica answers: nothing is lost end to end.
    assert tally.lost == 0, tally
    assert tally.wrong == 0, tally
    assert tally.errors == 0, tally
    after = await infer(client, "ncm-base", "still here?")
    assert after.ok


async def test_swapping_the_planner_strategy_reroutes_without_restarts(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=1)
    await wait_until_serving(client, "ncm-base")
    before, epoch = await plan(client)
    routers_and_nodes = {k: p.pid for k, p in processes.procs.items() if k != "planner"}
    processes.kill("planner", signal.SIGTERM)
    processes.start(
        "planner-2",
        "planner",
        "--id",
        "planner-2",
        "--topology",
        str(EXAMPLES / "swarm.json"),
        "--strategy",
        "proportional",
        "--settle-ms",
        "300",
    )

    async def replanned() -> bool:
        _, revision = await plan(client)
        return revision > epoch

    await wait_for(replanned, 10)
    after, _ = await plan(client)
    assert after.pipelines != before.pipelines

    async def routed_on_new_plan() -> bool:
        reply = await infer(client, "ncm-base", "which plan?")
        return (
            reply.ok
            and reply.route is not None
            and any(reply.route.stages == p.stages for p in after.pipelines)
        )

    await wait_for(routed_on_new_plan, 5)
    assert {
        k: p.pid for k, p in processes.procs.items() if k not in ("planner", "planner-2")
    } == routers_and_nodes
    assert all(p.poll() is None for k, p in processes.procs.items() if k != "planner")


async def test_routers_keep_serving_from_their_last_snapshot_and_say_it_is_stale(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=1)
    await wait_until_serving(client, "ncm-base")
    processes.kill("telemetry", signal.SIGKILL)
    processes.kill("planner", signal.SIGKILL)
    await asyncio.sleep(0.8)  # past the router's --stale-ms 500
    for i in range(5):
        reply = await infer(client, "ncm-base", f"no planner, no telemetry {i}")
        assert reply.ok, reply.error
    stats = json.loads((await client.request("$SRV.STATS.hecate-router", b"", timeout=2)).data)
    data = next(e["data"] for e in stats["endpoints"] if e["name"] == "infer")
    assert data["snapshot"] == "stale"
    assert data["plan_epoch"] >= 1
    # The services catch up when restarted: telemetry rewrites a fresh snapshot.
    processes.start("telemetry-2", "telemetry", "--id", "telemetry-2")

    async def fresh() -> bool:
        msg = await client.request("$SRV.STATS.hecate-router", b"", timeout=2)
        doc = json.loads(msg.data)
        return bool(
            next(e["data"] for e in doc["endpoints"] if e["name"] == "infer")["snapshot"] == "fresh"
        )

    await wait_for(fresh, 10)
