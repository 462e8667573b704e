"""What a node says of its own speed, heard on the bus: nothing before it has run
anything, then what it measured (its warm-up pass on adopting a plan, then its stages),
injected slowness included."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from hecate.bus import kv as kvs
from hecate.core import NodeProfile, SwarmPlan
from hecate.model import Executor
from hecate.wire import subjects
from hecate.wire.messages import ErrorReply, FaultAck, Heartbeat, LayersStage, NodeFault
from hecate.wire.stages import StageReply, reply_decoder
from hecate_node.config import NodeConfig
from hecate_node.service import Node
from hecate_node.upstream import UpstreamModel
from tests.support.provider import FakeProvider, provider
from tests.support.swarm import EXAMPLES, Processes
from tests.support.waits import until
from tests.system.test_faults import telemetry

_beat = msgspec.json.Decoder(Heartbeat)
_stage_reply = reply_decoder()
_error_reply = msgspec.msgpack.Decoder(ErrorReply)
NODE = "solo"
DECLARED_MS = 40.0


@pytest.fixture
async def heartbeats(client: Client) -> AsyncIterator[Subscription]:
    sub = await client.subscribe(subjects.intake("*", NODE))
    yield sub
    await sub.unsubscribe()


def start_node(processes: Processes, *extra: str) -> None:
    processes.start(
        f"node-{NODE}",
        "node",
        "--id",
        NODE,
        "--capacity-layers",
        "12",
        "--latency-ms",
        str(DECLARED_MS),
        "--heartbeat-ms",
        "50",
        *extra,
    )


def start_planner(processes: Processes) -> None:
    processes.start(
        "planner",
        "planner",
        "--id",
        "planner",
        "--topology",
        str(EXAMPLES / "swarm.json"),
        "--pipelines",
        "1",
        "--settle-ms",
        "100",
    )


async def next_beat(sub: Subscription) -> Heartbeat:
    msg = await sub.next_msg(timeout=5)
    return _beat.decode(msg.data)


async def latency_at_least(sub: Subscription, floor: float, within: float = 10.0) -> float:
    """The first measured latency of at least ``floor`` ms a heartbeat reports."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        latency = (await next_beat(sub)).latency_ms
        if latency is not None and latency >= floor:
            return latency
    raise AssertionError(f"no heartbeat reported a latency >= {floor} ms within {within}s")


async def run_stage(client: Client, within: float = 15.0) -> StageReply:
    """One whole-model stage on the node, sent straight to it once it hosts the range
    (the planner's plan is published and the node has adopted it)."""
    kv = await kvs.wait_bucket(client, subjects.PLAN_BUCKET)
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        try:
            entry = await kv.get(subjects.PLAN_KEY)
            plan = msgspec.json.decode(entry.value or b"", type=SwarmPlan)
            stage = next(
                s
                for p in plan.pipelines
                if p.model_id == "ncm-base"
                for s in p.stages
                if s.node_id == NODE
            )
            req = LayersStage(
                request_id=f"direct-{time.monotonic_ns()}",
                model_id="ncm-base",
                layer_start=stage.layer_start,
                layer_end=stage.layer_end,
                model_layers=12,
                epoch=int(entry.revision or 0),
                prompt="how fast are you?",
                decode_tokens=4,
            )
            msg = await client.request(
                subjects.node_run(NODE), msgspec.msgpack.encode(req), timeout=5
            )
            try:
                return _stage_reply.decode(msg.data)
            except msgspec.ValidationError:
                last = _error_reply.decode(msg.data).error
        except Exception as exc:  # no plan yet, or the node has not adopted it
            last = exc
        await asyncio.sleep(0.05)
    raise AssertionError(f"the node ran no stage within {within}s: {last!r}")


async def test_a_node_reports_no_latency_until_it_has_run_its_range(
    processes: Processes, client: Client, heartbeats: Subscription
) -> None:
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    start_node(processes)
    for _ in range(3):  # no plan, nothing run: its declared 40 ms is not a measurement
        assert (await next_beat(heartbeats)).latency_ms is None

    async def listed() -> bool:
        try:
            return NODE in (await telemetry(client)).nodes
        except Exception:
            return False

    await until(listed, "telemetry lists the node")
    seen = (await telemetry(client)).nodes[NODE]
    assert seen.alive
    assert seen.latency_ms is None  # unmeasured: the cost model's cold penalty applies

    start_planner(processes)
    # No stage is sent: adopting the plan, the node runs its range once and reports that.
    measured_ms = await latency_at_least(heartbeats, 0.0)
    assert measured_ms != DECLARED_MS  # what the toy range took, not what was declared

    async def measured() -> bool:
        return (await telemetry(client)).nodes[NODE].latency_ms is not None

    await until(measured, "the snapshot shows the measured latency")


async def test_an_injected_slowdown_shows_in_the_latency_a_node_reports(
    processes: Processes, client: Client, heartbeats: Subscription
) -> None:
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    start_planner(processes)
    start_node(processes, "--accept-faults")
    await run_stage(client)
    await latency_at_least(heartbeats, 0.0)
    # Far above what a toy stage takes, so that only a delay on the timer reaches it.
    delay_ms = 200.0

    fault = msgspec.json.encode(NodeFault(delay_ms=delay_ms))
    ack = await client.request(subjects.node_fault(NODE), fault, timeout=5)
    assert msgspec.json.decode(ack.data, type=FaultAck).ok
    for _ in range(8):  # each stage now takes at least delay_ms, all of it on the timer
        reply = await run_stage(client)
        assert reply.compute_ms >= delay_ms
    # After 8 slow samples the EWMA (alpha 0.3) holds at least 94 % of the delay.
    assert await latency_at_least(heartbeats, delay_ms / 2) >= delay_ms / 2

    async def telemetry_sees_it() -> bool:
        latency = (await telemetry(client)).nodes[NODE].latency_ms
        return latency is not None and latency >= delay_ms / 2

    await until(telemetry_sees_it, "telemetry sees the node slow down")


async def test_the_latency_a_node_reports_on_adopting_a_plan_is_its_warm_up_pass(
    processes: Processes, client: Client, heartbeats: Subscription
) -> None:
    start_node(processes, "--accept-faults")
    assert (await next_beat(heartbeats)).latency_ms is None
    # Slowed down before it holds anything, and far above what a toy range takes: a
    # latency this high can only come from a pass run on the node's own stage timer.
    delay_ms = 200.0
    fault = msgspec.json.encode(NodeFault(delay_ms=delay_ms))
    ack = await client.request(subjects.node_fault(NODE), fault, timeout=5)
    assert msgspec.json.decode(ack.data, type=FaultAck).ok
    start_planner(processes)  # no stage is ever sent to the node in this test
    assert await latency_at_least(heartbeats, delay_ms) >= delay_ms


def solo(executor: str | Executor) -> Node:
    """A node in this process, not connected: enough to drive its warm-up directly."""
    profile = NodeProfile(node_id=NODE, capacity_layers=12, latency_ms=DECLARED_MS)
    log = logging.getLogger("test.node")
    if isinstance(executor, str):
        return Node(NodeConfig(profile=profile, executor=executor), log=log)
    return Node(NodeConfig(profile=profile, executor=executor.name), log=log, executor=executor)


async def test_a_failed_warm_up_is_a_warning_and_leaves_the_node_unmeasured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = solo("toy")
    node.holdings.held = [("ncm-base", 0, 5000)]  # past MAX_LAYERS: the toy model refuses it
    with caplog.at_level(logging.WARNING, logger="test.node"):
        await node.holdings.warm_up(node.holdings.held)
    assert [r.getMessage() for r in caplog.records] == ["warm-up failed"]
    assert node.latency_ms is None
    node.holdings.held.append(("ncm-base", 0, 4))  # a range that runs is measured
    await node.holdings.warm_up(node.holdings.held[1:])
    assert node.latency_ms is not None


async def test_a_whole_model_executor_is_not_warmed_up() -> None:
    """Its pass would be a paid call to the provider: it stays unmeasured until traffic."""
    with provider("ok") as url:
        model = UpstreamModel(url, "gpt-test")
        node = solo(model)
        node.holdings.held = [("gpt", 0, 1)]
        await node.holdings.warm_up(node.holdings.held)
        await model.close()
    assert FakeProvider.requests == []
    assert node.latency_ms is None
