"""One trace from the client through the router and every stage, with correct parents.

Router and nodes run in this process (on the real nats-server) so that one in-memory
exporter sees every span; the trace context still crosses the bus in NATS headers.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from hecate.bus import tracing
from hecate.bus.server import NatsServer
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.model.toy import reference
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from hecate_node.config import NodeConfig
from hecate_node.service import Node
from hecate_planner.planstore import publish_by_hand
from hecate_router.service import RouterConfig, RouterService


async def test_one_trace_spans_client_router_and_every_stage(nats_server: NatsServer) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    log = logging.getLogger("hecate.test")
    nodes = [NodeProfile(node_id=n, capacity_layers=4) for n in ("a", "b", "c")]
    plan = SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id="m", layers=9),),
        nodes=tuple(nodes),
        pipelines=(
            Pipeline(
                pipeline_id="m-r0",
                model_id="m",
                stages=(
                    Stage(node_id="a", layer_start=0, layer_end=3),
                    Stage(node_id="b", layer_start=3, layer_end=6),
                    Stage(node_id="c", layer_start=6, layer_end=9),
                ),
            ),
        ),
    )
    nc = await nats.connect(nats_server.url)
    await publish_by_hand(nc, plan)  # any valid plan writer will do

    stop = asyncio.Event()
    services = [Node(NodeConfig(profile=p), log=log, tracer_provider=provider) for p in nodes]
    router = RouterService(RouterConfig(instance_id="r1"), log=log, tracer_provider=provider)
    tasks = [asyncio.create_task(s.run(nats_server.url, stop)) for s in services]
    tasks.append(asyncio.create_task(router.run(nats_server.url, stop)))
    try:
        tracer = provider.get_tracer("test-client")
        body = msgspec.json.encode(InferRequest(prompt="trace me", max_tokens=3))
        reply = None
        for _ in range(100):  # until the router has the plan and the nodes hold it
            with tracer.start_as_current_span("client infer", kind=SpanKind.CLIENT) as root:
                try:
                    msg = await nc.request(
                        subjects.infer("m"), body, timeout=2, headers=tracing.inject({})
                    )
                    reply = msgspec.json.decode(msg.data, type=InferReply)
                except Exception:
                    reply = None
            if reply is not None and reply.ok:
                break
            exporter.clear()
            await asyncio.sleep(0.05)
        assert reply is not None
        assert reply.ok, reply
        assert reply.output == reference("m", 9, "trace me", 3)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await nc.close()

    spans = exporter.get_finished_spans()
    trace_id = root.get_span_context().trace_id
    mine = [s for s in spans if s.context.trace_id == trace_id]
    by_name = {s.name: s for s in mine}
    router_span = by_name["router infer"]
    assert router_span.parent is not None
    assert router_span.parent.span_id == root.get_span_context().span_id
    for node in ("a", "b", "c"):
        stage = by_name[f"stage {node}"]
        assert stage.parent is not None
        assert stage.parent.span_id == router_span.context.span_id
        served = [
            s
            for s in mine
            if s.name == "node run"
            and s.parent is not None
            and s.parent.span_id == stage.context.span_id
        ]
        assert len(served) == 1, f"node {node} span is a child of its stage span"
    assert len([s for s in mine if s.name == "node run"]) == 3
