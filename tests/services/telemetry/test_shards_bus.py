"""Telemetry replicas sharing the heartbeat intake, on a real nats-server: the server
maps each node's beats to one partition, so each node is judged by exactly one replica,
and followers merge the replicas' snapshots into the whole swarm.

The heartbeaters are the test's own connection (see test_liveness_bus.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus import telemetry as telemetry_kv
from hecate.bus.server import NatsServer
from hecate.wire import subjects
from hecate.wire.messages import TelemetrySnapshot
from tests.services.telemetry.test_liveness_bus import Beats, Events
from tests.support.swarm import Processes
from tests.support.waits import endpoint_data, listening, stats, until

# Judged by the wall clock (a silent node called down in time), as test_liveness_bus.py:
# run alone, after the parallel tests.
pytestmark = pytest.mark.serial

SHARDS = 3
NODES = [f"n{i}" for i in range(24)]


async def replicas(processes: Processes, client: Client, shards: int = SHARDS) -> Events:
    events = Events()
    await client.subscribe(subjects.EVENT_NODE_DOWN, cb=events.heard)
    await client.subscribe(subjects.EVENT_NODE_UP, cb=events.heard)
    for k in range(shards):
        argv = ("--id", f"telemetry-{k}", "--shards", str(shards), "--shard", str(k))
        processes.start(f"telemetry-{k}", "telemetry", *argv)
    for k in range(shards):
        await listening(client, "telemetry", f"telemetry-{k}", "heartbeat")
    return events


async def shard_snapshots(client: Client, shards: int = SHARDS) -> list[TelemetrySnapshot]:
    kv = await kvs.bucket(client, subjects.TELEMETRY_BUCKET)
    out = []
    for k in range(shards):
        value, _revision = await kvs.get(kv, subjects.telemetry_key(k))
        if value is not None:
            out.append(msgspec.json.decode(value, type=TelemetrySnapshot))
    return out


async def merged(client: Client) -> TelemetrySnapshot | None:
    """What a follower holds: every shard's snapshot and the deltas after them."""
    kv = await kvs.bucket(client, subjects.TELEMETRY_BUCKET)
    return await telemetry_kv.read(kv, nc=client, listen_s=0.3)


async def snapshots_hold(client: Client, nodes: list[str], shards: int = SHARDS) -> bool:
    """Whether the shards' snapshots in KV (put every second or so) hold ``nodes``."""
    held = set().union(*(p.nodes for p in await shard_snapshots(client, shards)))
    return held >= set(nodes)


async def figures(client: Client, k: int) -> dict[str, Any]:
    data = endpoint_data(await stats(client, "telemetry", f"telemetry-{k}"), "heartbeat")
    return data or {}


async def all_alive(client: Client, nodes: list[str]) -> bool:
    snap = await merged(client)
    return snap is not None and all(snap.nodes.get(n) and snap.nodes[n].alive for n in nodes)


async def test_each_node_is_judged_by_one_replica_and_followers_see_the_whole_swarm(
    processes: Processes, client: Client
) -> None:
    events = await replicas(processes, client)
    beats = [Beats(client, n) for n in NODES]
    beating = {b.node_id: asyncio.create_task(b.forever(0.1)) for b in beats}
    try:
        await until(lambda: all_alive(client, NODES), "every node alive in the merged snapshot")
        await until(lambda: snapshots_hold(client, NODES), "every node in the snapshots")
        parts = await shard_snapshots(client)
        assert sorted(p.shard for p in parts) == list(range(SHARDS))
        assert all(p.shards == SHARDS for p in parts)
        held = [set(p.nodes) for p in parts]
        assert sum(len(h) for h in held) == len(NODES), held  # nobody in two shards
        assert set().union(*held) == set(NODES)
        assert all(held), f"a replica heard nobody: {held}"  # 24 ids over 3 shards
        for k in range(SHARDS):
            data = await figures(client, k)
            assert data["unmapped"] == 0, data  # every beat came through its partition
            assert data["beats_missed"] == 0, data  # and none was lost on the way
            assert data["partitions"] == list(subjects.shard_partitions(k, SHARDS))
        # One node goes silent: the replica that holds it, and only that one, calls it down.
        victim = NODES[5]
        owner = next(p.shard for p in parts if victim in p.nodes)
        beating.pop(victim).cancel()
        await until(lambda: bool(events.of(victim, "down")), f"{victim} declared down")
        await asyncio.sleep(0.3)  # a second replica's word would come within a sweep
        assert len(events.of(victim, "down")) == 1, events.seen
        snap = await merged(client)
        assert snap is not None
        assert not snap.nodes[victim].alive
        assert sum(t.alive for t in snap.nodes.values()) == len(NODES) - 1
        others = [p for p in await shard_snapshots(client) if p.shard != owner]
        assert all(victim not in p.nodes for p in others)
    finally:
        for task in beating.values():
            task.cancel()
    assert not [e for e in events.seen if e.state == "down" and e.node_id != victim], events.seen


async def test_a_server_without_the_mapping_still_has_every_node_judged_once(
    tmp_path: Path,
) -> None:
    """A server someone configured without the partition mapping delivers every beat
    unmapped, to every replica: each takes only its own partitions' share, and says so."""
    server = NatsServer(tmp_path / "nats", mappings="").start()
    processes = Processes(url=server.url, logs=tmp_path)
    client = await nats.connect(server.url)
    try:
        await replicas(processes, client, shards=2)
        beats = [Beats(client, n) for n in NODES[:12]]
        beating = [asyncio.create_task(b.forever(0.1)) for b in beats]
        try:
            await until(lambda: all_alive(client, NODES[:12]), "every node alive")
        finally:
            for task in beating:
                task.cancel()
        await until(lambda: snapshots_hold(client, NODES[:12], 2), "all in the snapshots")
        held = [set(p.nodes) for p in await shard_snapshots(client, 2)]
        assert sum(len(h) for h in held) == 12
        assert set().union(*held) == set(NODES[:12])
        for k in range(2):
            assert (await figures(client, k))["unmapped"] > 0
        logs = "".join(processes.log(f"telemetry-{k}") for k in range(2))
        assert "heartbeats arrive unmapped" in logs
    finally:
        await client.close()
        processes.stop_all()
        server.stop()
