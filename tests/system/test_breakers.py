"""Shared circuit breakers across three router replicas, on a real nats-server."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import msgspec
from nats.aio.client import Client

from hecate.bus.settle import settled
from hecate.wire import subjects
from hecate.wire.messages import OutcomeReport
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    infer,
    start_swarm,
    wait_until_serving,
)
from tests.support.waits import planned, router_infer_stats


async def router_data(client: Client, routers: int) -> list[dict[str, Any]]:
    """Every router's infer statistics. All of them: a sum or an ``all()`` over the
    replicas that happened to answer first would miss the one that matters."""
    out = await router_infer_stats(client, routers, 10.0)  # a bound on a busy machine, not a wait
    assert len(out) == routers, f"{len(out)} of {routers} routers answered $SRV.STATS"
    return out


async def breaker_listening(client: Client) -> None:
    """Until the breaker service lists its report endpoint. It answers $SRV on the
    connection that subscribed, after subscribing, so a report sent from here on is
    heard (a report nobody hears is gone: core NATS keeps nothing)."""
    deadline = time.monotonic() + 10.0
    last: object = None
    while time.monotonic() < deadline:
        try:
            msg = await client.request("$SRV.STATS.hecate-breaker", b"", timeout=1)
        except Exception as exc:  # not connected yet: no responders
            last = exc
        else:
            last = [e["name"] for e in json.loads(msg.data)["endpoints"]]
            if "report" in last:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the breaker service never listened for reports: {last!r}")


async def test_an_open_circuit_reaches_every_router_and_exactly_one_probe_is_admitted(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=3)
    processes.start(
        "breaker", "breaker", "--id", "breaker", "--cooldown-s", "1.5", "--probe-timeout-s", "3"
    )
    first = await wait_until_serving(client, "ncm-base")
    assert first.route is not None
    target = first.route.stages[0].node_id
    await planned(client, "ncm-base", pipelines=2, routers=3)  # one to route around it
    await breaker_listening(client)

    for _ in range(5):  # what routers report when a node answers 429 five times
        report = OutcomeReport(target=target, ok=False, code="rate_limited", router_id="test")
        await client.publish(subjects.breaker_report(target), msgspec.json.encode(report))
    await settled(client)

    seen = time.monotonic()
    while True:
        data = await router_data(client, 3)
        if len(data) == 3 and all(target in d["breakers_open"] for d in data):
            break
        assert time.monotonic() - seen < 10, data  # a bound, not a latency figure
        await asyncio.sleep(0.01)
    for i in range(6):  # no request goes to the open target
        reply = await infer(client, "ncm-base", f"avoid the open circuit {i}")
        assert reply.ok, reply.error
        assert reply.route is not None
        assert target not in [s.node_id for s in reply.route.stages]

    async def closed_everywhere() -> bool:
        return all(target not in d["breakers_open"] for d in await router_data(client, 3))

    # Once the cooldown is over all three routers race for the probe lease; the winner
    # spends it on a later request of its own through the target. So traffic goes on
    # until the circuit is closed everywhere: a fixed number of requests could all end
    # before the lease is even granted on a busy machine, and then nothing probes.
    deadline = time.monotonic() + 30  # cooldown 1.5 s; a bound, not a wait
    i = 0
    while not await closed_everywhere():
        assert time.monotonic() < deadline, "the successful probe closes the circuit"
        reply = await infer(client, "ncm-base", f"after the cooldown {i}")
        assert reply.ok, reply.error
        i += 1
    data = await router_data(client, 3)
    assert sum(int(d["probe_leases_won"]) for d in data) == 1, data
    served = False
    for i in range(20):
        reply = await infer(client, "ncm-base", f"closed again {i}")
        if reply.route is not None and target in [s.node_id for s in reply.route.stages]:
            served = True
            break
    assert served, "traffic returns to the target once its circuit closes"


async def test_when_every_copy_of_the_base_is_behind_an_open_circuit_the_reserve_answers(
    processes: Processes, client: Client
) -> None:
    start_swarm(
        processes,
        EXAMPLES / "degraded.json",
        [("gpu", 12, 3.5, 4.0), ("edge", 4, 9.0, 1.0)],
        pipelines=1,
    )
    processes.start("breaker", "breaker", "--id", "breaker", "--cooldown-s", "30")
    await wait_until_serving(client, "ncm-base")
    await breaker_listening(client)
    for _ in range(5):
        report = OutcomeReport(target="gpu", ok=False, code="rate_limited", router_id="test")
        await client.publish(subjects.breaker_report("gpu"), msgspec.json.encode(report))
    await settled(client)
    deadline = time.monotonic() + 10  # a bound on a busy machine
    while True:
        reply = await infer(client, "ncm-base", "the base is unavailable", 4)
        if reply.degraded or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert reply.ok, reply.error
    assert reply.degraded is True  # said, never silent
    assert reply.route is not None
    assert reply.route.model_id == "ncm-mini"
    data = await router_data(client, 1)
    assert data[0]["counters"].get("degraded", 0) >= 1
