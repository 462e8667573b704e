"""The chaos scenarios. Each runs a fresh swarm of real processes on loopback
(``topologies/chaos.json``, shipped with this package: a 12-layer toy model on two
3-stage pipelines, a spare node and a 4-layer reserve; two routers), waits until it
serves, starts the load, lets it run ``warm`` seconds, injects its fault, heals it, and
keeps the load on ``settle`` seconds more. Acceptance, for every scenario (see
:mod:`hecate.dev.chaos.acceptance`): nothing lost, nothing wrong, no explicit error unless
the scenario names its code and why, no reserve answer beside an intact pipeline, and
the evidence its :class:`Expect` names that the fault hit live traffic.

* ``node-kill``: SIGKILL the middle node of the busiest pipeline; restart it later.
* ``router-kill``: freeze one of the two routers (SIGSTOP) long enough that requests are
  certainly waiting on it, then SIGKILL it; restart it later.
* ``control-plane``: SIGKILL the planner, then telemetry, then the breaker service, one
  at a time, each restarted before the next: routers serve from their last snapshots.
* ``nats-restart``: SIGKILL the nats-server and start it again on the same port and
  JetStream store: every service reconnects, the plan survives, service resumes.
* ``sick-node``: a node stays up but each stage takes ten times its declared latency,
  then fails with an error, then heals (injected over ``hecate.node.<id>.fault``; chaos
  swarms start nodes with ``--accept-faults``): telemetry sees it slow, load moves off
  it, its circuit opens, and closes again.
* ``nats-cluster``: three routed nats-servers; SIGKILL the one the callers are on.
* ``llm-kill``: ``node-kill`` on SmolLM2 (two 3-stage pipelines), mid-generation.
* ``llm-overload``: 16 callers streaming SmolLM2 generations at once (8 with
  ``--short``), each with its own prompt of ``hecate bench llm``'s set; ``node-kill``
  mid-way, the restart, and the wait for its first heartbeat. Beyond the acceptance
  above: no node declared down but the killed one, and full rate again within 2 s of
  its return (:mod:`hecate.dev.chaos.overload`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.client import HecateClient
from hecate.core.plan import SwarmPlan
from hecate.dev.bench.concurrency import PROMPTS
from hecate.dev.chaos import overload
from hecate.dev.chaos.acceptance import Expect, judge
from hecate.dev.chaos.faults import (
    Fault,
    Timing,
    cluster_member_kill,
    control_plane,
    nats_restart,
    node_kill,
    router_kill,
    sick_node,
)
from hecate.dev.chaos.harness import Swarm
from hecate.dev.chaos.load import Record, prompt, prompts, run_load, summarize
from hecate.model import reference
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent, Heartbeat, InferReply, NodeEvent

__all__ = [
    "SCENARIOS",
    "Scenario",
    "Setup",
    "Timing",
    "available",
    "figures",
    "run",
    "topology",
]

MODEL = "ncm-base"
LLM = "smollm2-135m"


def topology(name: str) -> bytes:
    """A topology the scenarios run (``topologies/NAME``): package data, so that an
    installed hecate runs its scenarios without a source checkout."""
    return (resources.files("hecate.dev.chaos") / "topologies" / name).read_bytes()


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


@dataclass(frozen=True)
class Setup:
    """The swarm and the load a scenario runs with (``topology``: a file of
    ``topologies/``)."""

    topology: str = "chaos.json"
    dispatch: str = "hop"
    max_tokens: int = 6
    workers: int = 4
    timeout_s: float = 2.0
    cluster: int = 1
    stream: bool = False  # callers stream their tokens (their arrival times are kept)
    prompt_set: tuple[str, ...] = ()  # worker w's i-th prompt: [(w + i) % workers]
    short_workers: int | None = None  # with --short, when it differs
    short_max_tokens: int | None = None

    def of(self, short: bool) -> Setup:
        """The setup a run uses (``short``: the tests' size, where it differs)."""
        if not short:
            return self
        return dataclasses.replace(
            self,
            workers=self.short_workers or self.workers,
            max_tokens=self.short_max_tokens or self.max_tokens,
        )

    def prompt(self, worker: int, i: int) -> str:
        if not self.prompt_set:
            return prompt(worker, i)
        return self.prompt_set[(worker + i) % min(self.workers, len(self.prompt_set))]

    def prompts(self) -> list[str]:
        """Every prompt the load sends."""
        if not self.prompt_set:
            return prompts(self.workers)
        return sorted(set(self.prompt_set[: self.workers]))


LLM_SETUP = Setup(
    topology="smollm2.json", dispatch="chain", max_tokens=16, workers=2, timeout_s=20.0
)
# Sixteen users at once: a generation can take minutes on two cores when they all wait
# their turn, and silence until then is what "lost" must mean.
LLM_OVERLOAD_SETUP = Setup(
    topology="smollm2.json",
    dispatch="chain",
    max_tokens=32,
    workers=16,
    timeout_s=240.0,
    stream=True,
    prompt_set=PROMPTS,
    short_workers=8,
    short_max_tokens=16,
)


@dataclass(frozen=True)
class Scenario:
    """A fault, the swarm it runs on, and what its run must show."""

    fault: Fault
    expect: Expect
    setup: Setup = field(default_factory=Setup)
    # (short, long) timings where the default ones do not fit the load.
    timing: tuple[Timing, Timing] | None = None
    # The scenario's own checks and notes, from the whole record once the load is over.
    findings: Callable[[Record], None] | None = None

    def timing_of(self, short: bool) -> Timing:
        if self.timing is None:
            return Timing.of(short)
        return self.timing[0] if short else self.timing[1]


_KILLED_NODE = Expect(
    ("failover_events",),
    "requests in flight on the killed node, and those routed to it before telemetry "
    "calls it down, fail over; the node killed is the busiest middle one",
)


async def overload_kill(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    """``node-kill`` (the busiest middle node, restarted ``t.fault`` later), then the wait
    for the restarted node's first heartbeat, marked on the record: what "back" means
    for :mod:`hecate.dev.chaos.overload`."""
    beats: list[tuple[float, str]] = []

    async def on_beat(msg: Msg) -> None:
        beats.append((time.monotonic(), msgspec.json.decode(msg.data, type=Heartbeat).node_id))

    sub = await nc.subscribe(subjects.HEARTBEAT_ALL, cb=on_beat)
    try:
        await node_kill(swarm, nc, record, t)
        restarted = record.faults[-1][0]
        victim = next(iter(record.impaired))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120  # a node process loads its weights before it beats
        while loop.time() < deadline:
            back = [at for at, node in beats if node == victim and at > restarted]
            if back:
                record.faults.append((back[0], f"node {victim} heartbeats again"))
                record.notes["restart_to_heartbeat_s"] = round(back[0] - restarted, 2)
                return
            await asyncio.sleep(0.1)  # polling what the subscription collects
    finally:
        await sub.unsubscribe()


def overload_findings(record: Record) -> None:
    """:func:`hecate.dev.chaos.overload.findings` on a finished ``llm-overload`` record."""
    killed = next(at for at, what in record.faults if what.startswith("SIGKILL"))
    back = next((at for at, what in record.faults if what.endswith("heartbeats again")), None)
    victim = next(iter(record.impaired))
    checks, notes = overload.findings(record.tokens, killed, back, victim, record.node_events)
    record.checks.update(checks)
    record.notes.update(notes)


SCENARIOS: dict[str, Scenario] = {
    "node-kill": Scenario(node_kill, _KILLED_NODE),
    "router-kill": Scenario(
        router_kill,
        Expect(
            ("client_retries", "recover_s"),
            "the requests the frozen router holds get no reply: their callers time out "
            "and retry on the other router",
        ),
    ),
    "control-plane": Scenario(
        control_plane,
        Expect(
            ("answered_during_outages",),
            "none of the three is on the request path: what must show is requests "
            "answered from start to end while each one was down",
        ),
    ),
    "nats-restart": Scenario(
        nats_restart,
        Expect(
            ("recover_s",),
            "nothing is answered while the only server is down (about a second), so "
            "every request in flight then takes far longer than 3x the pre-fault p99 "
            "(the routers resend what they hold once reconnected, so callers need not "
            "retry)",
        ),
    ),
    "sick-node": Scenario(
        sick_node,
        Expect(
            ("failover_events",),
            "stages the node refuses with an error fail over to the replica (and open its circuit)",
        ),
    ),
    "nats-cluster": Scenario(
        cluster_member_kill,
        Expect(
            ("recover_s",),
            "the killed server is the callers' own: no request they have in flight can "
            "be answered before their connection has moved to another server",
        ),
        Setup(cluster=3),
    ),
    # The real model, mid-generation (``hecate model pull smollm2-135m`` first).
    "llm-kill": Scenario(node_kill, _KILLED_NODE, LLM_SETUP),
    # Many users at once on SmolLM2, a stage killed among them (the model pulled first).
    "llm-overload": Scenario(
        overload_kill,
        Expect(
            ("failover_events",),
            "every node is working on some of the generations in flight when one of "
            "them is killed: those fail over to the replica",
        ),
        LLM_OVERLOAD_SETUP,
        timing=(Timing(6.0, 1.5, 4.0), Timing(10.0, 4.0, 8.0)),
        findings=overload_findings,
    ),
}


def available(name: str) -> bool:
    """False for a scenario whose model is not in the local cache."""
    if SCENARIOS[name].setup.topology == LLM_SETUP.topology:
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


def figures(name: str, record: Record) -> dict[str, Any]:
    """A scenario's line of figures from its record, with what it must show and every
    criterion of its acceptance judged."""
    expect = SCENARIOS[name].expect
    result = summarize(name, record)
    result["expect"] = expect.doc()
    result["acceptance"] = judge(result, expect)
    return result


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
    scenario = SCENARIOS[name]
    setup = scenario.setup.of(short)
    timing = scenario.timing_of(short)
    with tempfile.TemporaryDirectory(prefix=f"hecate-chaos-{name}-") as tmp:
        where = workdir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        path = where / "topology.json"  # what the planner and the routers are given
        path.write_bytes(topology(setup.topology))
        swarm = Swarm(where, path, dispatch=setup.dispatch, cluster=setup.cluster)
        model = swarm.topology.base.id
        layers = {m.id: m.layers for m in swarm.topology.models}
        ref = _Reference(setup, layers)
        for text in setup.prompts():
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
                record = Record(pipelines=await _pipelines(nc, model))
                failovers: list[float] = []

                async def on_failover(msg: Msg) -> None:
                    msgspec.json.decode(msg.data, type=FailoverEvent)
                    failovers.append(time.monotonic())

                await nc.subscribe(subjects.EVENT_FAILOVER, cb=on_failover)

                async def on_node(msg: Msg) -> None:
                    change = msgspec.json.decode(msg.data, type=NodeEvent)
                    record.node_events.append((time.monotonic(), change.node_id, change.state))

                await nc.subscribe(subjects.EVENT_NODE_DOWN, cb=on_node)
                await nc.subscribe(subjects.EVENT_NODE_UP, cb=on_node)
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
                await scenario.fault(swarm, nc, record, timing)
                await asyncio.sleep(timing.settle)
                stop.set()
                await load
                first = record.faults[0][0] if record.faults else float("inf")
                record.failover_events = sum(1 for at in failovers if at >= first)
                if scenario.findings is not None:
                    scenario.findings(record)
            finally:
                await nc.close()
        finally:
            await asyncio.to_thread(swarm.stop_all)
    result = figures(name, record)
    if scenario.timing is not None:  # the suite's saved timing is the default one
        result["timing"] = dataclasses.asdict(timing)
    if keep_timeline:
        from hecate.dev.chaos.plot import timeline_doc

        result["timeline"] = timeline_doc(record)
    if plot is not None:
        from hecate.dev.chaos.plot import timeline

        command = f"hecate chaos {name}{' --short' if short else ''} --plot {plot}"
        timeline(record, result, plot, command)
    return result
