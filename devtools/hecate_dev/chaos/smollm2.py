"""The chaos scenarios on the real model (``hecate model pull smollm2-135m`` first):
SmolLM2 on two 3-stage pipelines (``topologies/smollm2.json``), a node killed
mid-generation.

* ``llm-kill``: ``node-kill`` on SmolLM2, two callers.
* ``llm-overload``: 16 callers streaming SmolLM2 generations at once (8 with
  ``--short``), each with its own prompt of ``hecate bench llm``'s set; ``node-kill``
  mid-way, the restart, and the wait for its first heartbeat. Beyond every scenario's
  acceptance: no node declared down but the killed one, and full rate again within 2 s
  of its return (:mod:`hecate_dev.chaos.overload`).
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.wire import subjects
from hecate.wire.messages import Heartbeat
from hecate_dev.chaos import faults, overload
from hecate_dev.chaos.acceptance import Expect
from hecate_dev.chaos.faults import Timing
from hecate_dev.chaos.harness import Swarm
from hecate_dev.chaos.load import Record
from hecate_dev.chaos.results import ScenarioResult
from hecate_dev.chaos.scenario import Scenario, failovers, num, seconds
from hecate_dev.chaos.setup import LLM_OVERLOAD_SETUP, LLM_SETUP

KILLED_NODE = Expect(
    ("failover_events",),
    "requests in flight on the killed node, and those routed to it before telemetry "
    "calls it down, fail over; the node killed is the busiest middle one",
)


def finished_before_fault(r: ScenarioResult) -> list[float]:
    """Latencies (ms) of the requests that were answered right before the first fault,
    from the saved timeline (empty without one)."""
    t = r.timeline
    if t is None:
        return []
    return [
        latency
        for started, latency, status in zip(t.started_s, t.latency_ms, t.status, strict=True)
        if status == "ok" and started + latency / 1000 < 0
    ]


class LlmKill(Scenario):
    """The busiest middle node of SmolLM2's pipelines killed mid-generation."""

    name = "llm-kill"
    expect = KILLED_NODE
    setup = LLM_SETUP

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        await faults.node_kill(swarm, nc, record, t)

    def meaning(self, r: ScenarioResult) -> str:
        before = finished_before_fault(r)
        usual = (
            f"against {seconds(max(before))} for the slowest before the fault"
            if before
            else "no generation finished before the fault to compare with"
        )
        return (
            "a generation running through the killed stage is replayed onto the replica "
            f"(max {seconds(r.max_ms)}, {usual}); {failovers(r)} failovers."
        )


class LlmOverload(Scenario):
    """Many users at once on SmolLM2, a stage killed among them."""

    name = "llm-overload"
    expect = Expect(
        ("failover_events",),
        "every node is working on some of the generations in flight when one of "
        "them is killed: those fail over to the replica",
    )
    setup = LLM_OVERLOAD_SETUP
    timings = (Timing(6.0, 1.5, 4.0), Timing(10.0, 4.0, 8.0))

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        """``node-kill`` (the busiest middle node, restarted ``t.fault`` later), then the
        wait for the restarted node's first heartbeat, marked on the record: what
        "back" means for :mod:`hecate_dev.chaos.overload`."""
        beats: list[tuple[float, str]] = []

        async def on_beat(msg: Msg) -> None:
            node = msgspec.json.decode(msg.data, type=Heartbeat).node_id
            beats.append((time.monotonic(), node))

        sub = await nc.subscribe(subjects.INTAKE_ALL, cb=on_beat)
        try:
            await faults.node_kill(swarm, nc, record, t)
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

    def findings(self, record: Record) -> None:
        """:func:`hecate_dev.chaos.overload.findings` on the finished record."""
        killed = next(at for at, what in record.faults if what.startswith("SIGKILL"))
        back = next((at for at, what in record.faults if what.endswith("heartbeats again")), None)
        victim = next(iter(record.impaired))
        answers = [(s.started, s.nodes) for s in record.samples if s.status == "ok"]
        checks, notes = overload.findings(
            record.tokens, killed, back, victim, record.node_events, answers
        )
        record.checks.update(checks)
        record.notes.update(notes)

    def meaning(self, r: ScenarioResult) -> str:
        notes = r.notes
        rate = notes.get("tokens_per_s_before_kill")
        beat = notes.get("restart_to_heartbeat_s")
        full = notes.get("full_rate_s_after_heartbeat")
        downs = sorted(k.removeprefix("down_events_") for k in notes if k.startswith("down_"))
        streamed = f"{num(rate, 1)} tokens/s streamed before the kill" if rate else "no rate"
        back = (
            f"the restarted node beat again {num(beat, 2)} s after its restart"
            if beat is not None
            else "the restarted node was **never heard again**"
        )
        again = (
            f"full rate {num(full, 2)} s after that"
            if full is not None
            else "full rate **not** regained"
        )
        carried = notes.get("answers_through_the_killed_node_after_its_return")
        through = (
            f"{carried:.0f} generations started after its return were answered through it"
            if carried is not None
            else "whether it carried generations again was not recorded"
        )
        return (
            f"{r.sent:,} generations streamed by callers at once ({streamed}); "
            f"{failovers(r)} failovers; nodes declared down: {', '.join(downs) or 'none'}; "
            f"{back}, {again}; {through} (max {seconds(r.max_ms)})."
        )
