"""Telemetry's failure detector on a real nats-server: a node whose heartbeats come with
big gaps keeps its place, a silent one is declared down, and a stall of telemetry itself
counts against nobody.

The heartbeaters are the test's own connection: what is under test is how telemetry
reads the gaps between beats, so the beats' pacing is the input (those sleeps set the
gaps; nothing waits on them to synchronise)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus.server import NatsServer
from hecate.bus.settle import settled
from hecate.wire import subjects
from hecate.wire.messages import Heartbeat, NodeEvent
from hecate_dev.chaos.proxy import FaultProxy
from hecate_launcher import ProcessSpec
from tests.support.swarm import Processes
from tests.support.waits import endpoint_data, listening, stats, until

# Judged by the wall clock (how soon, how long): run alone, after the parallel tests.
pytestmark = pytest.mark.serial

_event = msgspec.json.Decoder(NodeEvent)


class Beats:
    """Heartbeats of one node from this test, at gaps it chooses; declares 100 ms as a
    real node does, whatever the gaps really are."""

    def __init__(self, client: Client, node_id: str) -> None:
        self.client = client
        self.node_id = node_id
        self.sent = 0

    async def beat(self) -> None:
        beat = Heartbeat(node_id=self.node_id, seq=self.sent, sent_at=0.0, interval_ms=100.0)
        await self.client.publish(subjects.heartbeat(self.node_id), msgspec.json.encode(beat))
        await settled(self.client)  # a cancelled flush would break the connection
        self.sent += 1

    async def every(self, gaps: list[float]) -> None:
        for gap in gaps:
            await self.beat()
            await asyncio.sleep(gap)

    async def forever(self, gap: float) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(gap)


class Events:
    def __init__(self) -> None:
        self.seen: list[NodeEvent] = []

    async def heard(self, msg: Msg) -> None:
        self.seen.append(_event.decode(msg.data))

    def of(self, node_id: str, state: str) -> list[NodeEvent]:
        return [e for e in self.seen if e.node_id == node_id and e.state == state]


async def telemetry(processes: Processes, client: Client) -> Events:
    events = Events()
    await client.subscribe(subjects.EVENT_NODE_DOWN, cb=events.heard)
    await client.subscribe(subjects.EVENT_NODE_UP, cb=events.heard)
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    await listening(client, "telemetry", "telemetry", "heartbeat")
    return events


async def figures(client: Client) -> dict[str, Any]:
    return endpoint_data(await stats(client, "telemetry", "telemetry"), "heartbeat") or {}


async def test_a_jittery_node_keeps_its_place_and_a_silent_one_is_declared_down(
    processes: Processes, client: Client
) -> None:
    events = await telemetry(processes, client)
    rng = random.Random(12)
    # 200-400 ms between beats, as under load: the old rule (3 x the declared 100 ms)
    # declared such a node down at its first 300 ms gap.
    jittery = Beats(client, "jittery")
    gaps = [0.2] * 5 + [rng.uniform(0.2, 0.4) for _ in range(25)]
    jitter = asyncio.create_task(jittery.every(gaps))
    silent = Beats(client, "silent")
    await silent.every([0.1] * 10)  # then nothing, as after a SIGKILL

    await until(lambda: bool(events.of("silent", "down")), "the silent node declared down")
    await jitter
    assert events.of("silent", "down")[0].reason.startswith("silent for")
    assert events.of("jittery", "up"), events.seen
    assert not events.of("jittery", "down"), "a node that only heartbeats late is not dead"
    # What its history bought it: more than the regular silent node's 0.48 s.
    data = await figures(client)
    assert data["patience_ms"]["jittery"] > 500, data


async def test_silence_telemetry_did_not_watch_counts_against_nobody(
    processes: Processes, client: Client
) -> None:
    events = await telemetry(processes, client)
    nodes = [Beats(client, f"n{i}") for i in range(3)]
    beating = [asyncio.create_task(n.forever(0.1)) for n in nodes]
    try:
        await until(lambda: all(events.of(n.node_id, "up") for n in nodes), "all nodes up")
        before = await figures(client)
        # Telemetry's own process does not run for far longer than any node's patience,
        # as when it is descheduled on a loaded machine; the nodes beat on meanwhile.
        pid = processes.procs["telemetry"].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(1.5)  # the length of the stall: the input, not a wait
        finally:
            os.kill(pid, signal.SIGCONT)

        async def judged_since() -> bool:
            data = await figures(client)
            return (
                data.get("stalls", 0) > before["stalls"]
                and data.get("sweeps", 0) > before["sweeps"] + 2
            )

        await until(judged_since, "telemetry noticed its stall and judged the nodes again")
    finally:
        for task in beating:
            task.cancel()
    assert not [e for e in events.seen if e.state == "down"], events.seen
    data = await figures(client)
    assert data["blind_s"] >= 1.0, data


async def test_telemetry_cut_off_itself_calls_nobody_down(
    processes: Processes, client: Client, nats_server: NatsServer
) -> None:
    """Telemetry's own link held open and silent (its server cut off, nothing closed)
    for four times every node's patience while the nodes beat on. Proves: it calls
    nobody down, neither meanwhile (what it would have said comes out when the link
    heals) nor after, and counts the sweeps it could not judge."""
    proxy = await FaultProxy([("127.0.0.1", nats_server.client_port)], seed=3).start()
    events = Events()
    await client.subscribe(subjects.EVENT_NODE_DOWN, cb=events.heard)
    await client.subscribe(subjects.EVENT_NODE_UP, cb=events.heard)
    argv = ("telemetry", "--id", "telemetry", "--nats", proxy.url)
    processes.supervisor.start(ProcessSpec("telemetry", argv, {"HECATE_LOG_LEVEL": "INFO"}))
    await listening(client, "telemetry", "telemetry", "heartbeat")
    nodes = [Beats(client, f"n{i}") for i in range(3)]
    beating = [asyncio.create_task(n.forever(0.1)) for n in nodes]
    try:
        await until(lambda: all(events.of(n.node_id, "up") for n in nodes), "all nodes up")
        await proxy.blackhole()
        try:
            await asyncio.sleep(2.0)  # the length of the cut: the input, not a wait
        finally:
            await proxy.heal()

        async def judging_again() -> bool:
            # Its answer comes on the healed link after everything it held.
            data = await figures(client)
            return data.get("deaf_sweeps", 0) > 0 and data.get("sweeps", 0) > 0

        await until(judging_again, "telemetry answering and judging again after the cut")
        before = (await figures(client))["sweeps"]

        async def judged_twice() -> bool:
            return int((await figures(client)).get("sweeps", 0)) > before + 2

        await until(judged_twice, "telemetry judged the nodes again")
        await client.flush()
    finally:
        for task in beating:
            task.cancel()
        await proxy.stop()
    assert not [e for e in events.seen if e.state == "down"], events.seen


async def test_telemetry_that_just_started_reports_no_silence_of_its_own_link(
    processes: Processes, client: Client
) -> None:
    """Proves: telemetry's first sweeps, with a node beating, count no sweep deaf and log
    no "link silent" (``make run`` logged one at start, for_s=193.1: the link's silence
    counted from the monotonic clock's zero, the machine's uptime)."""
    events = await telemetry(processes, client)
    node = Beats(client, "n0")
    beating = asyncio.create_task(node.forever(0.1))
    try:
        await until(lambda: bool(events.of("n0", "up")), "the node up")

        async def swept() -> bool:
            return int((await figures(client)).get("sweeps", 0)) >= 10

        await until(swept, "telemetry's first sweeps")
    finally:
        beating.cancel()
    data = await figures(client)
    assert data["deaf_sweeps"] == 0, (data, processes.log("telemetry"))
    assert "link silent" not in processes.log("telemetry")
