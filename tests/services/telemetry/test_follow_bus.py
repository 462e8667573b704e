"""A follower of telemetry (:func:`hecate.bus.telemetry.follow`, as routers and the
gateway run it) against real telemetry processes on a real nats-server: it hears what
changed as deltas, never the whole snapshot again while it keeps step, sees a node go
down at the next delta, and follows a telemetry replica killed and started again, or
replaced by its standby.

The heartbeaters are the test's own connection (see test_liveness_bus.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus import telemetry
from hecate.wire import subjects
from hecate.wire.messages import TelemetrySnapshot
from tests.services.telemetry.test_liveness_bus import Beats, Events
from tests.support.swarm import Processes
from tests.support.waits import endpoint_data, listening, stats, until

NODES = [f"f{i}" for i in range(12)]


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has spent (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Follower:
    """The merge as a follower holds it, updated by a task of its own."""

    def __init__(self) -> None:
        self.shards = telemetry.Shards()
        self.now: TelemetrySnapshot | None = None
        self.bad = 0
        self.started = asyncio.Event()  # subscribed, and the snapshots read

    async def run(self, client: Client) -> None:
        kv = await kvs.bucket(client, subjects.TELEMETRY_BUCKET)

        def bad(_revision: int, _exc: Exception) -> None:
            self.bad += 1

        async for merged, _part in telemetry.follow(client, kv, bad, shards=self.shards):
            self.started.set()
            if merged is not None:
                self.now = merged

    async def start(self, client: Client) -> asyncio.Task[None]:
        task = asyncio.create_task(self.run(client))
        await asyncio.wait_for(self.started.wait(), 10)
        return task

    def alive(self, node_id: str) -> bool | None:
        t = self.now.nodes.get(node_id) if self.now is not None else None
        return None if t is None else t.alive


@contextlib.asynccontextmanager
async def beating_and_followed(
    client: Client,
) -> AsyncIterator[tuple[Follower, dict[str, asyncio.Task[None]]]]:
    """A follower started, every one of NODES beating every 100 ms and alive for it;
    the beats (by node: cancel one to silence it) and the follower stopped after."""
    follower = Follower()
    following = await follower.start(client)
    beating = {n: asyncio.create_task(Beats(client, n).forever(0.1)) for n in NODES}
    try:
        await until(lambda: all(follower.alive(n) for n in NODES), "the follower holds all alive")
        yield follower, beating
    finally:
        for task in (*beating.values(), following):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following


async def start_telemetry(
    processes: Processes, client: Client, instance: str = "telemetry", *args: str
) -> None:
    processes.start(instance, "telemetry", "--id", instance, *args)
    await listening(client, "telemetry", instance, "heartbeat")


async def holding(client: Client, instance: str) -> bool:
    data = endpoint_data(await stats(client, "telemetry", instance), "heartbeat") or {}
    return bool(data.get("holding"))


async def test_a_follower_in_step_hears_deltas_and_a_node_down_at_once(
    processes: Processes, client: Client
) -> None:
    await start_telemetry(processes, client)
    async with beating_and_followed(client) as (follower, beating):
        stats = follower.shards.stats
        before = stats.snapshots
        await asyncio.sleep(2.5)  # past two of telemetry's snapshots
        assert stats.snapshots == before, "a follower in step read a snapshot again"
        assert stats.gaps == 0
        assert stats.deltas > 10

        beating.pop(NODES[3]).cancel()
        await until(lambda: follower.alive(NODES[3]) is False, "the silent node down")
        assert all(follower.alive(n) for n in NODES if n != NODES[3])
        assert follower.bad == 0


async def test_a_follower_follows_a_telemetry_replica_killed_and_started_again(
    processes: Processes, client: Client
) -> None:
    """The new replica counts its messages afresh (a new epoch): the follower takes its
    word over its predecessor's, and holds every node alive again."""
    await start_telemetry(processes, client)
    async with beating_and_followed(client) as (follower, _beating):
        epoch = follower.shards.held[0].epoch
        processes.kill("telemetry", signal.SIGKILL)
        await start_telemetry(processes, client)
        await until(lambda: follower.shards.held[0].epoch > epoch, "the new replica followed")
        await until(lambda: all(follower.alive(n) for n in NODES), "all alive again")


async def test_a_standby_replica_takes_over_its_shard_with_nobody_called_down(
    processes: Processes, client: Client
) -> None:
    """Two replicas of one shard: the lease's holder speaks, the other judges silently.
    The holder killed, the standby speaks once the lease's term passed, in a new
    epoch: every beating node stays alive for the follower, no node is called down
    for the takeover, and a node that goes silent afterwards is called down by the
    new holder."""
    events = Events()
    await client.subscribe(subjects.EVENT_NODE_DOWN, cb=events.heard)
    lease = ("--lease-ms", "900")
    await start_telemetry(processes, client, "telemetry-a", *lease)
    await start_telemetry(processes, client, "telemetry-b", *lease)
    async with beating_and_followed(client) as (follower, beating):
        assert await holding(client, "telemetry-a")
        assert not await holding(client, "telemetry-b")
        # Silent is idle: a standby waits for news (a writer that woke at once forever
        # took a whole core).
        standby = processes.supervisor.pid("telemetry-b")
        spent = cpu_seconds(standby)
        await asyncio.sleep(1.0)
        assert cpu_seconds(standby) - spent < 0.5
        epoch = follower.shards.held[0].epoch
        processes.kill("telemetry-a", signal.SIGKILL)
        await until(lambda: holding(client, "telemetry-b"), "the standby holds the lease")
        await until(lambda: follower.shards.held[0].epoch > epoch, "its epoch followed")
        await asyncio.sleep(0.5)
        assert all(follower.alive(n) for n in NODES)
        assert events.seen == [], "a node called down for the takeover"
        beating.pop(NODES[0]).cancel()
        await until(lambda: bool(events.of(NODES[0], "down")), "the new holder calls it down")
        await until(lambda: follower.alive(NODES[0]) is False, "and the follower sees it")


async def test_a_telemetry_frozen_past_its_lease_says_what_it_judged_once_thawed(
    processes: Processes, client: Client
) -> None:
    """Frozen (SIGSTOP) longer than its lease's term, a lone replica stops speaking;
    thawed, it renews its own lease and says what it judged meanwhile: the node that
    went silent is called down, and the follower sees it, while every node that beat
    on stays alive."""
    events = Events()
    await client.subscribe(subjects.EVENT_NODE_DOWN, cb=events.heard)
    await start_telemetry(processes, client, "telemetry", "--lease-ms", "600")
    async with beating_and_followed(client) as (follower, beating):
        pid = processes.supervisor.pid("telemetry")
        os.kill(pid, signal.SIGSTOP)
        beating.pop(NODES[1]).cancel()
        await asyncio.sleep(1.5)  # past its term, twice over
        os.kill(pid, signal.SIGCONT)
        await until(lambda: bool(events.of(NODES[1], "down")), "the silent node called down")
        await until(lambda: follower.alive(NODES[1]) is False, "and the follower sees it")
        await asyncio.sleep(0.5)
        assert [e.node_id for e in events.seen] == [NODES[1]], events.seen
        assert all(follower.alive(n) for n in NODES if n != NODES[1])
