"""Every failover tier with real processes: splice, degraded reserve, explicit error,
and a node that drains on SIGTERM."""

from __future__ import annotations

import asyncio
import signal

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.model import reference
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent

from .conftest import EXAMPLES, Processes, infer, start_swarm, wait_until_serving
from .load import run_load
from .test_faults import telemetry, wait_for

RACKS = [
    ("rack1-a", 6, 5.0, 2.0),
    ("rack1-b", 6, 5.0, 2.0),
    ("rack2-a", 6, 7.0, 2.0),
    ("rack2-b", 6, 7.0, 2.0),
]


async def down(client: Client, node: str) -> None:
    async def gone() -> bool:
        return not (await telemetry(client)).nodes[node].alive

    await wait_for(gone, 5)


async def test_two_losses_are_served_by_a_splice_bit_identical_to_the_reference(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "splice.json", RACKS)
    await wait_until_serving(client, "ncm-base")
    stop = asyncio.Event()
    load = asyncio.create_task(run_load(client, "ncm-base", 12, stop, workers=3))
    await asyncio.sleep(0.3)
    processes.kill("node-rack1-b")
    await down(client, "rack1-b")
    processes.kill("node-rack2-a")
    await down(client, "rack2-a")
    await asyncio.sleep(0.5)
    stop.set()
    tally = await load
    assert (tally.lost, tally.wrong, tally.errors) == (0, 0, 0), tally
    reply = await infer(client, "ncm-base", "spliced", 12)
    assert reply.ok, reply.error
    assert reply.output == reference("ncm-base", 12, "spliced", 12)
    assert reply.route is not None
    assert reply.route.pipeline_id.endswith("~splice")
    assert [s.node_id for s in reply.route.stages] == ["rack1-a", "rack2-b"]
    assert reply.degraded is False


async def test_losing_the_only_base_copy_degrades_to_the_reserve_and_says_so(
    processes: Processes, client: Client
) -> None:
    start_swarm(
        processes,
        EXAMPLES / "degraded.json",
        [("gpu", 12, 3.5, 4.0), ("edge", 4, 9.0, 1.0)],
        pipelines=1,
    )
    await wait_until_serving(client, "ncm-base")
    processes.kill("node-gpu")
    await down(client, "gpu")
    reply = await infer(client, "ncm-base", "fallback please", 5)
    assert reply.ok, reply.error
    assert reply.degraded is True
    assert reply.route is not None
    assert reply.route.model_id == "ncm-mini"
    assert reply.output == reference("ncm-mini", 4, "fallback please", 5)


async def test_an_unrecoverable_loss_is_an_explicit_error_not_a_timeout(
    processes: Processes, client: Client
) -> None:
    start_swarm(
        processes,
        EXAMPLES / "unrecoverable.json",
        [("gpu", 8, 3.5, 4.0), ("laptop", 4, 12.0, 1.5), ("pi", 2, 40.0, 0.5)],
        pipelines=1,
    )
    await wait_until_serving(client, "ncm-base")
    processes.kill("node-laptop")
    for _ in range(5):  # during detection and after it: always an answer, fast
        loop = asyncio.get_running_loop()
        started = loop.time()
        reply = await infer(client, "ncm-base", "anyone?", timeout=5)
        assert loop.time() - started < 1.0
        assert reply.ok is False
        assert reply.error is not None
        assert reply.error.code in {"unrecoverable", "no_healthy_pipeline"}, reply.error
        await asyncio.sleep(0.1)


async def test_a_node_stopped_with_sigterm_drains_and_loses_nothing(
    processes: Processes, client: Client
) -> None:
    start_swarm(
        processes,
        EXAMPLES / "swarm.json",
        [
            ("gpu", 12, 3.5, 4.0),
            ("laptop", 8, 12.0, 1.5),
            ("desktop", 6, 8.0, 2.0),
            ("pi", 4, 40.0, 0.5),
        ],
    )
    first = await wait_until_serving(client, "ncm-base")
    assert first.route is not None
    victim = first.route.stages[0].node_id
    stop = asyncio.Event()
    load = asyncio.create_task(run_load(client, "ncm-base", 12, stop, workers=4))
    await asyncio.sleep(0.4)
    processes.kill(f"node-{victim}", signal.SIGTERM)
    assert processes.procs[f"node-{victim}"].returncode == 0, "a drained node exits cleanly"
    await asyncio.sleep(0.6)
    stop.set()
    tally = await load
    assert (tally.lost, tally.wrong, tally.errors) == (0, 0, 0), tally
    log = processes.log(f"node-{victim}")
    assert "draining" in log
    assert "stopped" in log


# Two disjoint 3-stage pipelines of the 12-layer model: a-b-c and d-e-f.
CHAIN_NODES = [
    ("a", 4, 5.0, 2.0),
    ("b", 4, 5.0, 2.0),
    ("c", 4, 5.0, 2.0),
    ("d", 4, 6.0, 2.0),
    ("e", 4, 6.0, 2.0),
    ("f", 4, 6.0, 2.0),
]


async def test_chained_dispatch_answers_correctly_and_survives_a_middle_node_kill(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "splice.json", CHAIN_NODES, dispatch="chain")
    first = await wait_until_serving(client, "ncm-base")
    assert first.route is not None
    assert len(first.route.stages) == 3
    assert first.output == reference("ncm-base", 12, "ready?", 8)
    middle = first.route.stages[1].node_id
    stop = asyncio.Event()
    load = asyncio.create_task(run_load(client, "ncm-base", 12, stop, workers=3))
    await asyncio.sleep(0.3)
    processes.kill(f"node-{middle}")
    await down(client, middle)
    await asyncio.sleep(0.3)
    stop.set()
    tally = await load
    assert (tally.lost, tally.wrong, tally.errors) == (0, 0, 0), tally
    assert tally.ok > 10, tally


async def test_a_chained_stage_that_is_gone_is_named_within_milliseconds(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "splice.json", CHAIN_NODES, dispatch="chain")
    first = await wait_until_serving(client, "ncm-base")
    assert first.route is not None
    events: list[FailoverEvent] = []

    async def on_failover(msg: Msg) -> None:
        events.append(msgspec.json.decode(msg.data, type=FailoverEvent))

    await client.subscribe(subjects.EVENT_FAILOVER, cb=on_failover)
    # The middle stage of both pipelines: whichever the next request takes, its second
    # stage is gone, and so is the replica's.
    processes.kill("node-b")
    processes.kill("node-e")
    # Well before telemetry could call them down (300 ms): the node that forwarded to a
    # dead one heard NATS's no-responders on its relay subject and passed it on, so the
    # router blamed the right stage at once, not after node-down or the stage timeout.
    reply = await infer(client, "ncm-base", "ready?")
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code == "unrecoverable", reply.error
    await client.flush()
    await asyncio.sleep(0.05)
    assert {(e.lost_node, e.reason) for e in events} == {
        ("b", "no responders"),
        ("e", "no responders"),
    }, events
