"""node-freeze: a node stops (SIGSTOP: a GC pause, swap, a suspended laptop) with its
connection open, so NATS keeps delivering to it and nobody is told; after a while it
resumes (SIGCONT) and must serve again.

Unlike a kill, nothing announces the fault. The routers learn of it from whichever
comes first: telemetry's node-down (its heartbeats stopped), or their own stage timeout
(the chaos swarm's is 1.5 s); either way the stages it holds fail over to the replica.
So the worst latency a caller sees is bounded by that detection: a request that meets
the frozen node waits at most one stage timeout, and may meet it once more before every
router has heard, never its whole client timeout. After the SIGCONT the node answers
the stale stages it was sent (the routers drop those late replies), heartbeats again,
and is routed to again.
"""

from __future__ import annotations

import asyncio
import signal
import time

from nats.aio.client import Client

from hecate_dev.chaos.acceptance import Expect
from hecate_dev.chaos.faults import Timing, busiest_middle_node
from hecate_dev.chaos.harness import Swarm
from hecate_dev.chaos.load import Record
from hecate_dev.chaos.results import ScenarioResult
from hecate_dev.chaos.scenario import Scenario, failovers, num

STAGE_TIMEOUT_S = 1.5  # the harness starts its routers with --stage-timeout-ms 1500
# A request may meet the frozen node twice (a second router, or the same one once its
# suspicion lapsed, before telemetry's verdict) and then run on the replica.
WORST_BOUND_S = 2 * STAGE_TIMEOUT_S + 0.5


async def node_freeze(swarm: Swarm, nc: Client, record: Record, t: Timing) -> str:
    """Freeze the busiest middle node for ``t.fault`` seconds, then let it go on; the
    node frozen."""
    victim = await busiest_middle_node(swarm, nc, record)
    record.fault(f"SIGSTOP node {victim}")
    record.impair(victim)
    await asyncio.to_thread(swarm.kill, f"node-{victim}", signal.SIGSTOP, wait=False)
    await asyncio.sleep(t.fault)
    record.fault(f"SIGCONT node {victim}")
    await asyncio.to_thread(swarm.kill, f"node-{victim}", signal.SIGCONT, wait=False)
    record.notes["resumed_at"] = time.monotonic()
    return victim


def served_again(record: Record, node: str, healed: float | None) -> None:
    """Check that ``node`` carried answers again in the second half of the time after
    ``healed`` (the first half is for telemetry to hear it and the routers to take it
    back), noting its share."""
    if healed is None or not record.samples:
        record.checks["node_served_after"] = False
        return
    end = max(s.started for s in record.samples)
    since = healed + (end - healed) / 2
    share = record.share_via(node, since, end + 1e-9)
    record.notes["share_via_node_after"] = round(share, 3)
    record.checks["node_served_after"] = share > 0


def carried_again(r: ScenarioResult, after: str) -> str:
    """What :func:`served_again` found, in words: ``after`` is the end of the fault
    ("the SIGCONT", "the heal")."""
    share = r.notes.get("share_via_node_after")
    if share:
        return f"after {after} it carried {num(share, 3)} of the answers again"
    return f"after {after} it was **not** routed to again"


def worst_within_detection(record: Record) -> None:
    """Check that no caller waited past what failure detection allows
    (:data:`WORST_BOUND_S`), noting the bound."""
    worst = max((s.latency_ms for s in record.samples), default=0.0)
    record.notes["worst_bound_ms"] = WORST_BOUND_S * 1000
    record.checks["worst_within_detection"] = worst <= WORST_BOUND_S * 1000


class NodeFreeze(Scenario):
    """SIGSTOP the middle node of the busiest pipeline under load, SIGCONT it later."""

    name = "node-freeze"
    expect = Expect(
        ("failover_events",),
        "stages sent to the frozen node time out and fail over to the replica",
    )
    # The 10 s freeze in the long run: long past every detection timer.
    timings = (Timing(1.0, 3.0, 4.0), Timing(3.0, 10.0, 8.0))
    victim = ""

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        self.victim = await node_freeze(swarm, nc, record, t)

    def findings(self, record: Record) -> None:
        resumed = record.notes.pop("resumed_at", None)
        worst_within_detection(record)
        served_again(record, self.victim, resumed)

    def meaning(self, r: ScenarioResult) -> str:
        after = carried_again(r, "the SIGCONT")
        return (
            f"nothing announces a frozen node: {failovers(r)} failovers, each once telemetry's "
            f"node-down or the router's own stage timeout ({num(STAGE_TIMEOUT_S, 1)} s) "
            f"came first; the worst caller waited "
            f"{num(r.max_ms, 1)} ms against a bound of {num(WORST_BOUND_S, 1)} s (two "
            f"stage timeouts and the replica's run); {after}."
        )
