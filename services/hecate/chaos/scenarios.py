"""The chaos scenarios. Each runs a fresh swarm of real processes on loopback
(``examples/chaos.json``: a 12-layer toy model on two 3-stage pipelines, a spare node
and a 4-layer reserve; two routers), waits until it serves, starts the load, lets it
run ``warm`` seconds, injects its fault, heals it, and keeps the load on ``settle``
seconds more. Acceptance, for every scenario: nothing lost, nothing wrong.

* ``node-kill``: SIGKILL the middle node of the serving pipeline; restart it later.
* ``router-kill``: SIGKILL one of the two routers; restart it later.
* ``control-plane``: SIGKILL the planner, then telemetry, then the breaker service, one
  at a time, each restarted before the next: routers serve from their last snapshots.
* ``nats-restart``: SIGKILL the nats-server and start it again on the same port and
  JetStream store: every service reconnects, the plan survives, service resumes.
* ``sick-node``: a node stays up but answers 10x slower, then with errors, then heals
  (injected over ``hecate.node.<id>.fault``; chaos swarms start nodes with
  ``--accept-faults``): load moves off it, its circuit opens, and closes again.
* ``llm-kill``: ``node-kill`` on SmolLM2 (two 3-stage pipelines), mid-generation.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.chaos.harness import BREAKER_COOLDOWN_S, Swarm
from hecate.chaos.load import Record, prompts, run_load, summarize
from hecate.client import HecateClient
from hecate.model import reference
from hecate.wire import subjects
from hecate.wire.messages import BreakerChanged, FailoverEvent, InferReply, NodeFault

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TOPOLOGY = EXAMPLES / "chaos.json"
MODEL = "ncm-base"
LLM = "smollm2-135m"


@dataclass(frozen=True)
class Timing:
    warm: float  # load before the fault
    fault: float  # how long a fault lasts before it is healed
    settle: float  # load after the last heal

    @classmethod
    def of(cls, short: bool) -> Timing:
        return cls(1.0, 1.5, 2.0) if short else cls(3.0, 4.0, 5.0)


Scenario = Callable[[Swarm, Client, Record, Timing], Awaitable[None]]


async def _serving_route(nc: Client, model: str = MODEL) -> list[str]:
    reply = await HecateClient(nc, timeout_s=5.0).infer(model, "which route?", max_tokens=1)
    assert reply.route is not None, reply.error
    return [s.node_id for s in reply.route.stages]


async def node_kill(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    route = await _serving_route(nc, swarm.topology.base.id)
    victim = route[len(route) // 2]
    record.fault(f"SIGKILL node {victim}")
    await asyncio.to_thread(swarm.kill, f"node-{victim}")
    await asyncio.sleep(t.fault)
    record.fault(f"restart node {victim}")
    await asyncio.to_thread(swarm.restart, f"node-{victim}")


async def router_kill(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    del nc
    record.fault("SIGKILL router-1")
    await asyncio.to_thread(swarm.kill, "router-1")
    await asyncio.sleep(t.fault)
    record.fault("restart router-1")
    await asyncio.to_thread(swarm.restart, "router-1")


async def control_plane(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    del nc
    for label in ("planner", "telemetry", "breaker"):
        record.fault(f"SIGKILL {label}")
        await asyncio.to_thread(swarm.kill, label)
        await asyncio.sleep(t.fault)
        record.fault(f"restart {label}")
        await asyncio.to_thread(swarm.restart, label)
        await asyncio.sleep(t.fault / 2)


async def nats_restart(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    before = await kv.get(subjects.PLAN_KEY)
    record.fault("SIGKILL nats-server")
    await asyncio.to_thread(swarm.kill_server)
    await asyncio.sleep(min(1.0, t.fault))
    record.fault("restart nats-server (same port, same store)")
    await asyncio.to_thread(swarm.start_server)
    for _ in range(100):  # the load's own connection reconnects too
        try:
            after = await kv.get(subjects.PLAN_KEY)
            break
        except Exception:
            await asyncio.sleep(0.1)
    else:
        after = None
    record.checks["plan_survived"] = after is not None and after.value == before.value


async def cluster_member_kill(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    """Three routed nats-servers with every KV bucket replicated 3 times; SIGKILL one
    under load (the processes connected to it reconnect to the others), then restart it."""
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    before = await kv.get(subjects.PLAN_KEY)
    record.fault("SIGKILL nats-server 0 of 3")
    await asyncio.to_thread(swarm.kill_server, 0)
    await asyncio.sleep(t.fault)
    after = None
    for _ in range(100):  # from the surviving two (our own connection may be moving)
        try:
            after = await kv.get(subjects.PLAN_KEY)
            break
        except Exception:
            await asyncio.sleep(0.1)
    record.checks["plan_readable_with_a_server_down"] = (
        after is not None and after.value == before.value
    )
    record.fault("restart nats-server 0")
    await asyncio.to_thread(swarm.start_server, 0)


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


async def _fault(nc: Client, node: str, fault: NodeFault) -> None:
    await nc.request(subjects.node_fault(node), msgspec.json.encode(fault), timeout=5)


async def sick_node(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    """The middle node of the serving pipeline stays up but turns 10x slower, then
    answers every stage with an error, then heals. Load must move off it while slow;
    its circuit must open while it fails and close again once it is healthy."""
    route = await _serving_route(nc, swarm.topology.base.id)
    victim = route[len(route) // 2]
    declared = next(n.latency_ms for n in swarm.topology.nodes if n.id == victim)
    changes: list[tuple[float, str]] = []

    async def on_breaker(msg: Msg) -> None:
        change = msgspec.json.decode(msg.data, type=BreakerChanged)
        if change.target == victim:
            changes.append((time.monotonic(), change.state))

    sub = await nc.subscribe(subjects.EVENT_BREAKER, cb=on_breaker)
    loop = asyncio.get_running_loop()
    began = loop.time() - t.warm
    record.fault(f"node {victim} 10x slower")
    slow_at = loop.time()
    await _fault(nc, victim, NodeFault(delay_ms=10 * max(declared, 1.0)))
    await asyncio.sleep(t.fault)
    before = record.share_via(victim, began, slow_at)
    # Telemetry needs a few heartbeats to see the slowness: judge the second half.
    during = record.share_via(victim, slow_at + t.fault / 2, loop.time())
    record.notes["share_via_node_before"] = round(before, 3)
    record.notes["share_via_node_while_slow"] = round(during, 3)
    record.checks["load_moved_off_slow_node"] = during < before / 2
    record.fault(f"node {victim} answers every stage with an error")
    await _fault(nc, victim, NodeFault(error="internal"))
    await asyncio.sleep(t.fault)
    record.fault(f"node {victim} healed")
    healed = time.monotonic()
    await _fault(nc, victim, NodeFault())
    for _ in range(int((BREAKER_COOLDOWN_S + 15) / 0.1)):  # cooldown, then one probe
        if any(at > healed and state == "closed" for at, state in changes):
            break
        await asyncio.sleep(0.1)
    await sub.unsubscribe()
    record.checks["breaker_opened"] = any(state == "open" for _, state in changes)
    record.checks["breaker_closed_after_heal"] = any(
        at > healed and state == "closed" for at, state in changes
    )
    closed = [at for at, state in changes if at > healed and state == "closed"]
    if closed:
        record.notes["breaker_closed_s_after_heal"] = round(closed[0] - healed, 2)


@dataclass(frozen=True)
class Setup:
    """The swarm and the load a scenario runs with."""

    topology: Path = TOPOLOGY
    dispatch: str = "hop"
    max_tokens: int = 6
    workers: int = 4
    timeout_s: float = 2.0
    cluster: int = 1


LLM_SETUP = Setup(
    topology=EXAMPLES / "smollm2.json", dispatch="chain", max_tokens=16, workers=2, timeout_s=20.0
)

SCENARIOS: dict[str, tuple[Setup, Scenario]] = {
    "node-kill": (Setup(), node_kill),
    "router-kill": (Setup(), router_kill),
    "control-plane": (Setup(), control_plane),
    "nats-restart": (Setup(), nats_restart),
    "sick-node": (Setup(), sick_node),
    "nats-cluster": (Setup(cluster=3), cluster_member_kill),
    # The real model, mid-generation (``hecate model pull smollm2-135m`` first).
    "llm-kill": (LLM_SETUP, node_kill),
}


def available(name: str) -> bool:
    """False for a scenario whose model is not in the local cache."""
    if SCENARIOS[name][0] is LLM_SETUP:
        from hecate.llm.store import present

        return present(LLM)
    return True


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


async def _quiet(_exc: Exception) -> None:
    """Disconnections are the point here; the figures say what they cost."""


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


async def run(
    name: str,
    *,
    short: bool = False,
    workdir: Path | None = None,
    plot: Path | None = None,
    keep_timeline: bool = False,
) -> dict[str, Any]:
    """Run one scenario on a fresh swarm; returns its line of figures (and draws its
    latency timeline into ``plot``, a PNG, when given; with ``keep_timeline``, the figures
    carry every request under ``"timeline"``, enough to draw it later)."""
    setup, scenario = SCENARIOS[name]
    timing = Timing.of(short)
    with tempfile.TemporaryDirectory(prefix=f"hecate-chaos-{name}-") as tmp:
        swarm = Swarm(
            workdir or Path(tmp), setup.topology, dispatch=setup.dispatch, cluster=setup.cluster
        )
        model = swarm.topology.base.id
        layers = {m.id: m.layers for m in swarm.topology.models}
        ref = _Reference(setup, layers)
        for text in prompts(setup.workers):
            await asyncio.to_thread(ref.answer, model, text)
        try:
            await asyncio.to_thread(swarm.start_servers)
            if swarm.cluster > 1:
                await _replicated_buckets(swarm.url, swarm.cluster)
            await asyncio.to_thread(swarm.start_services)
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
                record = Record()
                failovers: list[str] = []

                async def on_failover(msg: Msg) -> None:
                    failovers.append(msgspec.json.decode(msg.data, type=FailoverEvent).kind)

                await nc.subscribe(subjects.EVENT_FAILOVER, cb=on_failover)
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
                    )
                )
                await asyncio.sleep(timing.warm)
                await scenario(swarm, nc, record, timing)
                await asyncio.sleep(timing.settle)
                stop.set()
                await load
                # Evidence that the fault hit requests in flight, not an idle corner.
                record.notes["failover_events"] = float(len(failovers))
            finally:
                await nc.close()
        finally:
            await asyncio.to_thread(swarm.stop_all)
    result = summarize(name, record)
    if keep_timeline:
        from hecate.chaos.plot import timeline_doc

        result["timeline"] = timeline_doc(record)
    if plot is not None:
        from hecate.chaos.plot import timeline

        command = f"hecate chaos {name}{' --short' if short else ''} --plot {plot}"
        timeline(record, result, plot, command)
    return result
