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
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.chaos.harness import Swarm
from hecate.chaos.load import Record, run_load, summarize
from hecate.client import HecateClient
from hecate.model import reference
from hecate.wire import subjects
from hecate.wire.messages import InferReply

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TOPOLOGY = EXAMPLES / "chaos.json"
MODEL = "ncm-base"


@dataclass(frozen=True)
class Timing:
    warm: float  # load before the fault
    fault: float  # how long a fault lasts before it is healed
    settle: float  # load after the last heal

    @classmethod
    def of(cls, short: bool) -> Timing:
        return cls(1.0, 1.5, 2.0) if short else cls(3.0, 4.0, 5.0)


Scenario = Callable[[Swarm, Client, Record, Timing], Awaitable[None]]


async def _serving_route(nc: Client) -> list[str]:
    reply = await HecateClient(nc, timeout_s=2.0).infer(MODEL, "which route?", max_tokens=1)
    assert reply.route is not None, reply.error
    return [s.node_id for s in reply.route.stages]


async def node_kill(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    route = await _serving_route(nc)
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


SCENARIOS: dict[str, Scenario] = {
    "node-kill": node_kill,
    "router-kill": router_kill,
    "control-plane": control_plane,
    "nats-restart": nats_restart,
}


def _check(layers: dict[str, int]) -> Callable[[str, InferReply], bool]:
    cache: dict[tuple[str, str], str] = {}

    def check(prompt: str, reply: InferReply) -> bool:
        model = reply.route.model_id if reply.route is not None else MODEL
        key = (model, prompt)
        if key not in cache:
            cache[key] = reference(model, layers[model], prompt, 6)
        return reply.output == cache[key]

    return check


async def _quiet(_exc: Exception) -> None:
    """Disconnections are the point here; the figures say what they cost."""


async def _wait_serving(nc: Client, timeout: float = 30.0) -> None:
    client = HecateClient(nc, timeout_s=2.0, max_attempts=1)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        reply = await client.infer(MODEL, "ready?", max_tokens=1)
        if reply.ok:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the swarm did not serve {MODEL} within {timeout} s")


async def run(name: str, *, short: bool = False, workdir: Path | None = None) -> dict[str, Any]:
    """Run one scenario on a fresh swarm; returns its line of figures."""
    scenario = SCENARIOS[name]
    timing = Timing.of(short)
    with tempfile.TemporaryDirectory(prefix=f"hecate-chaos-{name}-") as tmp:
        swarm = Swarm(workdir or Path(tmp), TOPOLOGY)
        layers = {m.id: m.layers for m in swarm.topology.models}
        try:
            await asyncio.to_thread(swarm.start_all)
            nc = await nats.connect(
                swarm.url,
                name="hecate-chaos-load",
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,
                error_cb=_quiet,
            )
            try:
                await _wait_serving(nc)
                record = Record()
                stop = asyncio.Event()
                load = asyncio.create_task(run_load(nc, MODEL, _check(layers), stop, record))
                await asyncio.sleep(timing.warm)
                await scenario(swarm, nc, record, timing)
                await asyncio.sleep(timing.settle)
                stop.set()
                await load
            finally:
                await nc.close()
        finally:
            await asyncio.to_thread(swarm.stop_all)
    return summarize(name, record)
