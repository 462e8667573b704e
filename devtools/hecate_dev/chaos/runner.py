"""How a scenario runs: a fresh swarm of real processes on loopback, the load started
once it serves, the scenario's fault injected after ``warm`` seconds and healed, the
load kept on ``settle`` seconds more, and the record turned into the scenario's judged
figures."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.client import HecateClient
from hecate.core.plan import SwarmPlan
from hecate.model.toy import reference
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent, InferReply, NodeEvent
from hecate_dev.chaos.harness import Swarm
from hecate_dev.chaos.load import Record, run_load
from hecate_dev.chaos.results import ScenarioResult, Timeline
from hecate_dev.chaos.scenario import Scenario
from hecate_dev.chaos.setup import LLM, MODEL, Setup, topology


async def _quiet(_exc: Exception) -> None:
    """Disconnections are the point here; the figures say what they cost."""


async def _replicated_buckets(url: str, replicas: int) -> None:
    """Create the KV buckets with ``replicas`` copies before any service does (as the
    deploy/ job does in production); retried while the cluster elects its leader."""
    nc = await nats.connect(url.split(","), error_cb=_quiet)
    try:
        for name in (subjects.PLAN_BUCKET, subjects.TELEMETRY_BUCKET, subjects.BREAKER_BUCKET):
            for attempt in range(100):
                try:
                    await kvs.bucket(nc, name, replicas=replicas)
                    break
                except Exception:
                    if attempt == 99:
                        raise
                    await asyncio.sleep(0.2)
    finally:
        await nc.close()


class _Reference:
    """The right answer per (model, prompt): the toy network, or SmolLM2's greedy text
    in this process; computed once each (SmolLM2's before the load starts)."""

    def __init__(self, setup: Setup, layers: dict[str, int]) -> None:
        self.setup = setup
        self.layers = layers
        self.cache: dict[tuple[str, str], str] = {}

    def answer(self, model: str, text: str) -> str:
        key = (model, text)
        if key not in self.cache:
            if model == LLM:
                from hecate.llm.reference import greedy_text
                from hecate.llm.store import model_path

                self.cache[key] = greedy_text(model_path(LLM), text, self.setup.max_tokens)
            else:
                self.cache[key] = reference(model, self.layers[model], text, self.setup.max_tokens)
        return self.cache[key]

    def check(self, text: str, reply: InferReply) -> bool:
        model = reply.route.model_id if reply.route is not None else MODEL
        return reply.output == self.answer(model, text)


async def _pipelines(nc: Client, model: str) -> list[tuple[str, ...]]:
    """The nodes of each pipeline of ``model`` in the current plan."""
    entry = await (await kvs.bucket(nc, subjects.PLAN_BUCKET)).get(subjects.PLAN_KEY)
    assert entry.value, "the swarm serves, so a plan exists"
    plan = msgspec.json.decode(entry.value, type=SwarmPlan)
    return [tuple(s.node_id for s in p.stages) for p in plan.pipelines_of(model)]


async def _wait_serving(nc: Client, model: str, timeout: float = 60.0) -> None:
    client = HecateClient(nc, timeout_s=5.0, max_attempts=1)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        reply = await client.infer(model, "ready?", max_tokens=1)
        if reply.ok:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the swarm did not serve {model} within {timeout} s")


async def _watch(nc: Client, record: Record, failovers: list[float]) -> None:
    """Failover events and telemetry's node verdicts, as the load runs."""

    async def on_failover(msg: Msg) -> None:
        msgspec.json.decode(msg.data, type=FailoverEvent)
        failovers.append(time.monotonic())

    async def on_node(msg: Msg) -> None:
        change = msgspec.json.decode(msg.data, type=NodeEvent)
        record.node_events.append((time.monotonic(), change.node_id, change.state))

    await nc.subscribe(subjects.EVENT_FAILOVER, cb=on_failover)
    await nc.subscribe(subjects.EVENT_NODE_DOWN, cb=on_node)
    await nc.subscribe(subjects.EVENT_NODE_UP, cb=on_node)


async def _under_load(scenario: Scenario, swarm: Swarm, ref: _Reference, short: bool) -> Record:
    """The load, the scenario's fault and heal, and the record of it all."""
    setup, timing = ref.setup, scenario.timing_of(short)
    model = swarm.topology.base.id
    nc = await nats.connect(
        swarm.url.split(","),
        name="hecate-chaos-load",
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,
        error_cb=_quiet,
    )
    try:
        await _wait_serving(nc, model)
        record = Record(pipelines=await _pipelines(nc, model))
        failovers: list[float] = []
        await _watch(nc, record, failovers)
        stop = asyncio.Event()
        load = asyncio.create_task(
            run_load(
                nc,
                model,
                ref.check,
                stop,
                record,
                workers=setup.workers,
                max_tokens=setup.max_tokens,
                timeout_s=setup.timeout_s,
                stream=setup.stream,
                prompt_of=setup.prompt,
            )
        )
        await asyncio.sleep(timing.warm)
        await scenario.inject(swarm, nc, record, timing)
        await asyncio.sleep(timing.settle)
        stop.set()
        await load
        first = record.faults[0][0] if record.faults else float("inf")
        record.failover_events = sum(1 for at in failovers if at >= first)
        scenario.findings(record)
        return record
    finally:
        await nc.close()


async def run(
    scenario: Scenario,
    *,
    short: bool = False,
    workdir: Path | None = None,
    plot: Path | None = None,
    keep_timeline: bool = False,
) -> ScenarioResult:
    """Run one scenario on a fresh swarm; returns its judged figures (and draws its
    latency timeline into ``plot``, a PNG, when given; with ``keep_timeline``, the
    result carries every request, enough to draw it later)."""
    setup = scenario.setup.of(short)
    with tempfile.TemporaryDirectory(prefix=f"hecate-chaos-{scenario.name}-") as tmp:
        where = workdir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        path = where / "topology.json"  # what the planner and the routers are given
        path.write_bytes(topology(setup.topology))
        swarm = Swarm(
            where,
            path,
            dispatch=setup.dispatch,
            cluster=setup.cluster,
            proxied=frozenset(setup.proxied),
        )
        ref = _Reference(setup, {m.id: m.layers for m in swarm.topology.models})
        for text in setup.prompts():
            await asyncio.to_thread(ref.answer, swarm.topology.base.id, text)
        try:
            await asyncio.to_thread(swarm.start_servers)
            if swarm.cluster > 1:
                await _replicated_buckets(swarm.url, swarm.cluster)
            await asyncio.to_thread(swarm.start_services)
            record = await _under_load(scenario, swarm, ref, short)
        finally:
            await asyncio.to_thread(swarm.stop_all)
    result = scenario.result(record, short)
    if keep_timeline:
        from hecate_dev.chaos.plot import timeline_doc

        result = msgspec.structs.replace(
            result, timeline=msgspec.convert(timeline_doc(record), Timeline)
        )
    if plot is not None:
        from hecate_dev.chaos.plot import timeline

        command = f"hecate chaos {scenario.name}{' --short' if short else ''} --plot {plot}"
        timeline(record, result, plot, command)
    return result
