"""Faults with real processes: kill -9 means kill -9.

Nothing here waits for a length of time or asserts one: each step waits for the state it
needs (answers counted, a node called down, a router's status), within deadlines that
only a broken swarm reaches, and each test asserts what happened and why.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.bus import telemetry as telemetry_kv
from hecate.bus.settle import settled
from hecate.core import SwarmPlan
from hecate.model.toy import reference
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent, NodeEvent, TelemetrySnapshot
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    infer,
    start_swarm,
    wait_until_serving,
)
from tests.support.waits import GENEROUS_S, planned, router_status, routers_ready, until
from tests.system.load import start_load

# A stage timeout no test here lives to see: a flight held by a dead node can then only
# be rescued by a sign of the death itself, and one that waited for the timer would
# still be in the air when the test looks.
BEYOND_THE_TEST_MS = 300_000

T = TypeVar("T")


async def telemetry(nc: Client) -> TelemetrySnapshot:
    """Telemetry as a follower holds it: the snapshots in KV (put every second or so)
    and the deltas after them, which bring every node's liveness up to date."""
    kv = await kvs.bucket(nc, subjects.TELEMETRY_BUCKET)
    snapshot = await telemetry_kv.read(kv, nc=nc, listen_s=0.3)
    assert snapshot is not None, "no telemetry written yet"
    return snapshot


async def plan(nc: Client) -> tuple[SwarmPlan, int]:
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    entry = await kv.get(subjects.PLAN_KEY)
    return msgspec.json.decode(entry.value or b"", type=SwarmPlan), int(entry.revision or 0)


async def collect(nc: Client, subject: str, type_: type[T]) -> list[T]:
    """Every message published on ``subject`` from now on, decoded, in a list that
    fills as they arrive (subscribed, and the subscription flushed, before returning)."""
    seen: list[T] = []

    async def on_message(msg: Msg) -> None:
        seen.append(msgspec.json.decode(msg.data, type=type_))

    await nc.subscribe(subject, cb=on_message)
    await settled(nc)
    return seen


async def node_alive(nc: Client, node_id: str) -> bool:
    return (await telemetry(nc)).nodes[node_id].alive


def sign_of_death(reason: str) -> bool:
    """NATS's no-responders (sent to a node that is gone) or telemetry's node-down
    (for a request the node had already taken): not the stage timeout, nor an error."""
    return reason == "no responders" or reason.startswith("node down: silent for")


async def test_sigkill_a_node_under_load_loses_nothing_and_the_swarm_heals(
    processes: Processes, client: Client
) -> None:
    """A node SIGKILLed while it carries the load. Proves: no request is lost, wrong or
    an error (an intact replica existed throughout); the kill hit live traffic (failover
    events name the victim, and every rescue went to a route without it); telemetry
    noticed the death from the node's silence, the only sign a SIGKILLed node gives;
    every request the victim held was rescued on a sign of its death (NATS's
    no-responders or telemetry's node-down), never by waiting out a stage timeout, which
    is set beyond the test here, so nothing is left in the air; and once restarted, the
    node is in the plan's healthy swarm and serves again."""
    start_swarm(
        processes,
        EXAMPLES / "swarm.json",
        SWARM_NODES,
        routers=2,
        stage_timeout_ms=BEYOND_THE_TEST_MS,
    )
    await wait_until_serving(client, "ncm-base")
    await routers_ready(client, "router-1", "router-2")
    # Both pipelines planned before the kill: nodes join one by one, and on a loaded
    # machine the first plan holds one, whose node's death leaves no replica to serve.
    await planned(client, "ncm-base", pipelines=2, routers=2)
    first = await wait_until_serving(client, "ncm-base")  # a route on the whole plan
    assert first.route is not None
    victim = first.route.stages[0].node_id  # on the cheapest pipeline: it carries the load
    failovers = await collect(client, subjects.EVENT_FAILOVER, FailoverEvent)
    downs = await collect(client, subjects.EVENT_NODE_DOWN, NodeEvent)

    load = start_load(client, "ncm-base", 12, workers=4)
    await load.answered(20, "the swarm under load before the kill")
    processes.kill(f"node-{victim}", signal.SIGKILL)

    async def victim_down() -> bool:
        return not await node_alive(client, victim)

    await until(victim_down, f"telemetry calling {victim} down")
    await load.answered(20, f"served while {victim} is dead")
    processes.node(victim, *next((c, lat, s) for n, c, lat, s in SWARM_NODES if n == victim))

    async def victim_up() -> bool:
        return await node_alive(client, victim)

    await until(victim_up, f"telemetry hearing the restarted {victim}")
    await load.answered(20, f"served once {victim} is back")
    tally = await load.finish()

    assert tally.lost == 0, tally
    assert tally.wrong == 0, tally
    assert tally.errors == 0, tally  # an intact replica existed all along
    mine = [e for e in failovers if e.lost_node == victim]
    assert mine, "a failover event names the victim: the kill hit live traffic"
    assert {e.kind for e in mine} == {"replica"}
    assert all(
        e.new_route is not None and victim not in [s.node_id for s in e.new_route.stages]
        for e in mine
    )
    assert all(sign_of_death(e.reason) for e in mine), sorted({e.reason for e in mine})
    await until(lambda: any(d.node_id == victim for d in downs), f"the node-down event of {victim}")
    assert all(d.reason.startswith("silent for") for d in downs if d.node_id == victim), downs

    async def nothing_in_flight() -> bool:
        statuses = [await router_status(client, r) for r in ("router-1", "router-2")]
        return all(s is not None and s["in_flight"] == 0 for s in statuses)

    await until(nothing_in_flight, "every flight landed (none left waiting on the dead node)")

    # Healthy again: every planned pipeline intact, and the victim carries traffic again.
    async def every_planned_node_alive() -> bool:
        snap = await telemetry(client)
        current, _ = await plan(client)
        return all(snap.nodes[s.node_id].alive for p in current.pipelines for s in p.stages)

    await until(every_planned_node_alive, "every node of the plan alive")

    async def victim_serves() -> bool:
        reply = await infer(client, "ncm-base", "after the storm")
        return (
            reply.ok
            and reply.route is not None
            and victim in [s.node_id for s in reply.route.stages]
        )

    await until(victim_serves, f"a request routed through the restarted {victim}")


async def test_a_request_left_with_no_route_waits_for_the_node_that_went_silent(
    processes: Processes, client: Client
) -> None:
    """The only copy of layers 8-12 frozen (SIGSTOP) with a request in flight, past
    telemetry's verdict, then thawed (SIGCONT) within the router's wait for a route, as
    a node behind a partition that heals comes back. Proves: the request is held, not
    answered unrecoverable, and is answered right once the node is heard again; the
    failover event says it waited."""
    only_copy = [("gpu", 8, 3.5, 4.0), ("laptop", 4, 12.0, 1.5), ("pi", 2, 40.0, 0.5)]
    start_swarm(
        processes, EXAMPLES / "unrecoverable.json", only_copy, pipelines=1, route_wait_ms=20_000
    )
    await wait_until_serving(client, "ncm-base")
    failovers = await collect(client, subjects.EVENT_FAILOVER, FailoverEvent)
    downs = await collect(client, subjects.EVENT_NODE_DOWN, NodeEvent)
    processes.supervisor.kill("node-laptop", signal.SIGSTOP, wait=False)
    asked = asyncio.create_task(infer(client, "ncm-base", "hold on", timeout=GENEROUS_S))
    try:
        await until(lambda: any(d.node_id == "laptop" for d in downs), "laptop called down")
        assert not asked.done(), asked.result()
    finally:
        processes.supervisor.kill("node-laptop", signal.SIGCONT, wait=False)
    reply = await asked
    assert reply.ok, reply.error
    assert reply.output == reference("ncm-base", 12, "hold on", 8)
    mine = [e for e in failovers if e.lost_node == "laptop"]
    assert mine, failovers
    assert all(e.kind != "unrecoverable" for e in mine), mine
    assert any("for a route" in e.reason for e in mine), mine


async def test_killing_a_router_replica_leaves_the_other_serving(
    processes: Processes, client: Client
) -> None:
    """A router replica SIGKILLed while both carry the load. Proves: the other replica
    goes on serving alone, and nothing is lost, wrong or an error end to end: a request
    the dead replica had taken gets no reply, the client re-sends it after its own
    timeout, and the surviving replica answers."""
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=2)
    await wait_until_serving(client, "ncm-base")
    await routers_ready(client, "router-1", "router-2")
    load = start_load(client, "ncm-base", 12, workers=4)

    async def answering(router_id: str) -> bool:
        status = await router_status(client, router_id)
        return status is not None and status["counters"].get("answered", 0) > 0

    await until(lambda: answering("router-1"), "router-1 carrying its share of the load")
    await load.answered(20, "both replicas under load")
    processes.kill("router-1", signal.SIGKILL)
    await load.answered(20, "router-2 serving alone")
    tally = await load.finish()
    assert tally.lost == 0, tally
    assert tally.wrong == 0, tally
    assert tally.errors == 0, tally
    after = await infer(client, "ncm-base", "still here?")
    assert after.ok


async def test_swapping_the_planner_strategy_reroutes_without_restarts(
    processes: Processes, client: Client
) -> None:
    """A planner replaced by one with another strategy. Proves: a new plan is written,
    different from the old one, the router serves along it, and no router or node was
    restarted for it."""
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

    await until(replanned, "a plan written by the new planner")
    after, _ = await plan(client)
    assert after.pipelines != before.pipelines

    async def routed_on_new_plan() -> bool:
        reply = await infer(client, "ncm-base", "which plan?")
        return (
            reply.ok
            and reply.route is not None
            and any(reply.route.stages == p.stages for p in after.pipelines)
        )

    await until(routed_on_new_plan, "a request routed along the new plan")
    assert {
        k: p.pid for k, p in processes.procs.items() if k not in ("planner", "planner-2")
    } == routers_and_nodes
    assert all(p.poll() is None for k, p in processes.procs.items() if k != "planner")


async def test_routers_keep_serving_from_their_last_snapshot_and_say_it_is_stale(
    processes: Processes, client: Client
) -> None:
    """Telemetry and the planner both SIGKILLed. Proves: once the router's telemetry is
    older than its --stale-ms it says so in its status, and it still serves from the
    plan and telemetry it last had; a restarted telemetry makes it fresh again."""
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=1)
    await wait_until_serving(client, "ncm-base")
    processes.kill("telemetry", signal.SIGKILL)
    processes.kill("planner", signal.SIGKILL)

    async def snapshot_is(state: str) -> bool:
        status: dict[str, Any] | None = await router_status(client, "router-1")
        return status is not None and status["snapshot"] == state

    await until(lambda: snapshot_is("stale"), "the router calling its snapshot stale")
    for i in range(5):
        reply = await infer(client, "ncm-base", f"no planner, no telemetry {i}")
        assert reply.ok, reply.error
    status = await router_status(client, "router-1")
    assert status is not None
    assert status["snapshot"] == "stale"  # served while stale, not after a refresh
    assert status["plan_epoch"] >= 1
    # The services catch up when restarted: telemetry rewrites a fresh snapshot.
    processes.start("telemetry-2", "telemetry", "--id", "telemetry-2")
    await until(lambda: snapshot_is("fresh"), "the router fresh again")
