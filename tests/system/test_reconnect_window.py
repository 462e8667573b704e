"""A node that dies with the server: after its own reconnect, the router forgives a
no-responders only while a node may just not be back yet, and what it hears of the
rest of the swarm ends that for a node that never comes back.

No timing is asserted: the test waits for the router to blame the dead node on its
no-responders (not on a stage timeout, set beyond the test), and the log's figures
(reconnect to blame) are printed for whoever wants to see how soon it came.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import nats
from nats.aio.client import Client

from hecate.bus.server import NatsServer
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    infer,
    start_swarm,
    wait_until_serving,
)
from tests.support.waits import router_status, routers_ready, until
from tests.system.load import start_load

BEYOND_THE_TEST_MS = 300_000  # only a sign of the death can rescue a flight, never a timer


def router_events(procs: Processes, name: str) -> list[dict[str, Any]]:
    docs = []
    for line in procs.log("router-1").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == name:
            docs.append(doc)
    return docs


async def test_a_node_killed_as_the_server_restarts_is_blamed_once_the_rest_is_back(
    nats_server: NatsServer, processes: Processes
) -> None:
    """The server goes down, the node carrying the load is SIGKILLed meanwhile (nobody
    can hear it go), and the server comes back. Proves: the requests routed to the dead
    node are answered right through a failover that names it, on NATS' no-responders
    (the window closed on the evidence), not a stage timeout nor an error."""
    # Telemetry allows 15 missed beats (3 s): its node-down must not come before the
    # load does (on a busy machine the load may start half a second after the swarm is
    # back, and a node already called down is routed around, never sent to), and what
    # is under test is the router's own window closing on what it heard, long before.
    start_swarm(
        processes,
        EXAMPLES / "swarm.json",
        SWARM_NODES,
        stage_timeout_ms=BEYOND_THE_TEST_MS,
        telemetry_args=("--missed", "15"),
    )
    nc: Client = await nats.connect(
        nats_server.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1
    )
    try:
        first = await wait_until_serving(nc, "ncm-base")
        assert first.route is not None
        victim = first.route.stages[0].node_id  # on the cheapest pipeline: it takes the load
        await routers_ready(nc, "router-1")

        port = nats_server.client_port
        nats_server.stop()
        await until(lambda: not nc.is_connected, "the client noticed the server is gone")
        processes.kill(f"node-{victim}", signal.SIGKILL)  # dies with the server
        nats_server.port, nats_server.client_port = port, 0
        await asyncio.to_thread(nats_server.start)
        await until(lambda: nc.is_connected, "the client is back")

        load = start_load(nc, "ncm-base", 12, workers=4, timeout=10.0, client_attempts=3)

        def blamed() -> bool:
            return any(
                e.get("lost_node") == victim and e.get("reason") == "no responders"
                for e in router_events(processes, "failover")
            )

        await until(blamed, f"the router blaming {victim} on its no-responders")
        await load.answered(10, f"served without {victim}")
        tally = await load.finish()
        assert (tally.wrong, tally.errors) == (0, 0), tally

        reply = await infer(nc, "ncm-base", "after the restart")
        assert reply.ok, reply
        assert reply.route is not None
        assert victim not in [s.node_id for s in reply.route.stages]

        status = await router_status(nc, "router-1")
        assert status is not None
        assert status["counters"].get("failovers", 0) >= 1, status["counters"]

        back = min(e["ts"] for e in router_events(processes, "reconnected"))
        blames = [
            e["ts"] - back
            for e in router_events(processes, "failover")
            if e.get("lost_node") == victim and e["ts"] >= back
        ]
        print(
            f"reconnect -> first blame of {victim}: {min(blames):.3f} s "
            f"(failovers naming it: {len(blames)}; resent after reconnect: "
            f"{status['counters'].get('resent_after_reconnect', 0)})"
        )
    finally:
        await nc.close()
