"""``hecate status`` on a real bus reads the circuits the routers obey: a pipeline whose
node's circuit the breaker service opened is not servable, although every node is alive,
and it is probing again once telemetry hears its node come back."""

from __future__ import annotations

import time

import msgspec
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer
from hecate.cli.client import gather, render
from hecate.wire import subjects
from hecate.wire.messages import NodeEvent, NodeTelemetry, OutcomeReport, TelemetrySnapshot
from tests.support.builders import pipeline, plan
from tests.support.swarm import Processes
from tests.support.waits import listening, until

PLAN = plan(
    [
        pipeline("m-r0", "m", ("alpha-0", 0, 2), ("beta-0", 2, 4)),
        pipeline("m-r1", "m", ("alpha-1", 0, 2), ("beta-1", 2, 4)),
    ]
)


async def headline(url: str) -> str:
    text = render(await gather(url))
    return next(line for line in text.splitlines() if line.startswith("swarm: "))


async def test_status_says_which_pipelines_the_routers_would_refuse(
    nats_server: NatsServer, processes: Processes, client: Client
) -> None:
    # The planner's and telemetry's parts, written directly: every node alive.
    plans = await kvs.bucket(client, subjects.PLAN_BUCKET)
    await plans.put(subjects.PLAN_KEY, msgspec.json.encode(PLAN))
    now = time.time()
    snapshot = TelemetrySnapshot(
        written_at=now,
        nodes={n.node_id: NodeTelemetry(alive=True, last_seen=now) for n in PLAN.nodes},
    )
    telemetry = await kvs.bucket(client, subjects.TELEMETRY_BUCKET)
    await telemetry.put(subjects.telemetry_key(0), msgspec.json.encode(snapshot))
    processes.start("breaker", "breaker", "--id", "breaker", "--failure-threshold", "2")
    await listening(client, "breaker", "breaker", "node-up")
    assert (await headline(nats_server.url)).startswith("swarm: healthy (2/2 pipelines servable")

    for _ in range(2):  # alpha-0 stopped answering: its circuit opens
        failure = OutcomeReport(target="alpha-0", ok=False, code="timeout")
        await client.publish(subjects.breaker_report("alpha-0"), msgspec.json.encode(failure))
    last: list[str] = []

    async def says(expected: str) -> bool:
        last[:] = [await headline(nats_server.url)]
        return last[0] == expected

    await until(
        lambda: says(
            "swarm: degraded (1/2 pipelines servable: circuits open on alpha-0; "
            "2/2 intact, 4/4 nodes alive)"
        ),
        "status names the open circuit",
        last=last,
    )

    up = NodeEvent(node_id="alpha-0", state="up", reason="heartbeat", at=time.time())
    await client.publish(subjects.EVENT_NODE_UP, msgspec.json.encode(up))
    await until(
        lambda: says(
            "swarm: degraded (1/2 pipelines servable: probing alpha-0; 2/2 intact, 4/4 nodes alive)"
        ),
        "status shows the circuit waiting for its probe once the node is back",
        last=last,
    )
