"""Faults of a node's link rather than of the node: every node runs behind a fault proxy
of its own (:mod:`hecate_dev.chaos.proxy`), and the scenario acts on the victim's.

node-blackhole: the link goes silent without a reset, as when a route between two
machines dies: no byte passes either way and neither end is told. The node's own client
pings every 5 s and gives up after 3 unanswered, so for the first 15-20 s nothing at the
node's end notices; nor does the server, which still holds an open socket. As for a
frozen node (:mod:`hecate_dev.chaos.freeze`), the routers must learn of it from
telemetry's node-down (its heartbeats stop arriving) or from their own stage timeouts,
so the worst caller is bounded the same way.

The proxy *holds* the bytes (it stops reading, the senders' buffers fill) rather than
dropping them: that is what a dead route does to a TCP connection, whose bytes are
retransmitted until they get through or the connection is given up, never lost from the
middle of its stream. Dropping would be a fault TCP cannot have (a subscription sent
meanwhile lost for good, a cut frame the server closes the connection over), a test of
the proxy more than of the swarm. After the heal the held bytes arrive late: the node
runs the stale stages it was sent (the routers drop their late replies), heartbeats
again and is routed to again.

slow-link: the victim's link gets +25 ms each way with up to 10 ms of jitter (50-70 ms
round trip, a server across the internet) while staying up. Every stage sent to the node
pays that on each crossing, so requests routed through it slow down, pile up there, and
the routers (which count their own requests in flight on each node) send less its way.
Telemetry must not declare the node down: its heartbeats come late, not never.

What the link costs does not reach telemetry's latency for the node: a node reports the
time its stages take to compute, which no link changes. The scenario notes telemetry's
figure before and while slow, so that a router that comes to measure round trips itself
shows here; it is not a check, since today the share falls by the in-flight count alone.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import msgspec
from nats.aio.client import Client

from hecate_dev.chaos.acceptance import Expect, judge
from hecate_dev.chaos.faults import Timing, _latency, _telemetry, busiest_middle_node
from hecate_dev.chaos.freeze import (
    STAGE_TIMEOUT_S,
    WORST_BOUND_S,
    carried_again,
    served_again,
    worst_within_detection,
)
from hecate_dev.chaos.harness import Swarm
from hecate_dev.chaos.load import Record
from hecate_dev.chaos.results import ScenarioResult
from hecate_dev.chaos.scenario import Scenario, failovers, num
from hecate_dev.chaos.setup import Setup

# Every node behind a proxy: the victim is chosen only once the load runs.
PROXIED_SETUP = Setup(proxied=("node-*",))

# slow-link's toxics, per direction: 50-70 ms more per round trip.
SLOW_LATENCY_MS = 25.0
SLOW_JITTER_MS = 10.0
SLOW_RTT_MS = 2 * SLOW_LATENCY_MS
SLOWED = "slowed_answers"


class NodeBlackhole(Scenario):
    """The busiest middle node's link holds every byte, both ways, for ``t.fault``
    seconds without closing (a half-open link), then passes them on."""

    name = "node-blackhole"
    setup = PROXIED_SETUP
    expect = Expect(
        ("failover_events",),
        "stages sent into the silent link time out (or meet telemetry's node-down) and "
        "fail over to the replica",
    )
    # The 10 s in the long run: past telemetry's detection, short of the node's
    # own ping timeout (15-20 s), so only the swarm's detectors can see it.
    timings = (Timing(1.0, 3.0, 4.0), Timing(3.0, 10.0, 8.0))
    victim = ""

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        self.victim = await busiest_middle_node(swarm, nc, record)
        proxy = swarm.proxy(f"node-{self.victim}")
        record.fault(f"blackhole node {self.victim}'s link (held, not closed)")
        record.impair(self.victim)
        await proxy.blackhole()
        await asyncio.sleep(t.fault)
        record.fault(f"heal node {self.victim}'s link")
        await proxy.heal()
        record.notes["healed_at"] = time.monotonic()

    def findings(self, record: Record) -> None:
        healed = record.notes.pop("healed_at", None)
        worst_within_detection(record)
        # Nothing but telemetry's heartbeats can tell the swarm the node is gone: its
        # connection stays open (the routers' own timeouts only say a stage was late).
        cut = record.faults[0][0] if record.faults else float("inf")
        down = [
            at
            for at, node, state in record.node_events
            if node == self.victim and state == "down" and cut <= at <= (healed or 0.0)
        ]
        record.checks["telemetry_declared_it_down"] = bool(down)
        if down:
            record.notes["node_down_s_after_blackhole"] = round(down[0] - cut, 2)
        served_again(record, self.victim, healed)  # the held bytes drain first, too

    def meaning(self, r: ScenarioResult) -> str:
        after = carried_again(r, "the heal")
        down_s = r.notes.get("node_down_s_after_blackhole")
        down = (
            f"telemetry declared the node down {num(down_s, 2)} s after its link went silent"
            if down_s is not None
            else "telemetry **never** declared the node down"
        )
        return (
            f"nothing announces a silent link: {down}; {failovers(r)} failovers, each once "
            f"telemetry's node-down or the router's own stage timeout "
            f"({num(STAGE_TIMEOUT_S, 1)} s) came first; the worst caller waited "
            f"{num(r.max_ms, 1)} ms against a bound of {num(WORST_BOUND_S, 1)} s; {after}."
        )


def _median_ms(record: Record, node: str, start: float, end: float) -> float | None:
    """The median latency of the right answers started in [start, end) routed via
    ``node`` (None: there were none)."""
    via = [
        s.latency_ms
        for s in record.samples
        if start <= s.started < end and s.status == "ok" and node in s.nodes
    ]
    return statistics.median(via) if via else None


class SlowLink(Scenario):
    """The busiest middle node's link gets 50-70 ms more round trip, with jitter, for
    ``t.fault`` seconds, then is clean again; the node never goes down."""

    name = "slow-link"
    setup = PROXIED_SETUP
    expect = Expect(
        ("slowed_answers",),
        "every stage sent over the slow link pays its added round trip, so the answers "
        "routed through the node while it is slow take that much longer",
    )
    timings = (Timing(1.0, 4.0, 3.0), Timing(3.0, 10.0, 6.0))
    victim = ""

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        self.victim = victim = await busiest_middle_node(swarm, nc, record)
        proxy = swarm.proxy(f"node-{victim}")
        loop = asyncio.get_running_loop()
        seen_before = _latency(await _telemetry(nc), victim)
        record.fault(
            f"node {victim}'s link +{SLOW_LATENCY_MS:g} ms each way, jitter {SLOW_JITTER_MS:g} ms"
        )
        slow_at = time.monotonic()
        await proxy.set(latency_ms=SLOW_LATENCY_MS, jitter_ms=SLOW_JITTER_MS)
        peak: float | None = None
        end = loop.time() + t.fault
        while loop.time() < end:  # what telemetry publishes while the link is slow
            await asyncio.sleep(0.1)
            seen = _latency(await _telemetry(nc), victim)
            if seen is not None:
                peak = seen if peak is None else max(peak, seen)
        record.fault(f"node {victim}'s link clean again")
        healed = time.monotonic()
        await proxy.clear()
        record.notes.update(
            slow_at=slow_at,
            healed_at=healed,
            telemetry_latency_ms_before=round(seen_before or 0.0, 3),
            telemetry_latency_ms_while_slow=round(peak or 0.0, 3),
        )

    def findings(self, record: Record) -> None:
        slow_at = record.notes.pop("slow_at", None)
        healed = record.notes.pop("healed_at", None)
        if slow_at is None or healed is None or not record.samples:
            record.checks["load_moved_off_slow_link"] = False
            return
        began = min(s.started for s in record.samples)
        end = max(s.started for s in record.samples) + 1e-9
        before = record.share_via(self.victim, began, slow_at)
        # The second half of the window: the first requests into the slow link are what
        # teaches the routers (their own requests in flight pile up on it).
        during = record.share_via(self.victim, slow_at + (healed - slow_at) / 2, healed)
        after = record.share_via(self.victim, healed + (end - healed) / 2, end)
        record.notes["share_via_node_before"] = round(before, 3)
        record.notes["share_via_node_while_slow"] = round(during, 3)
        record.notes["share_via_node_after"] = round(after, 3)
        record.checks["load_moved_off_slow_link"] = during < before
        # The fault hit live traffic: answers through the node took at least one more
        # round trip of the link than before.
        fast = _median_ms(record, self.victim, began, slow_at)
        slow = _median_ms(record, self.victim, slow_at, healed)
        record.notes["median_ms_via_node_before"] = round(fast or 0.0, 1)
        record.notes["median_ms_via_node_while_slow"] = round(slow or 0.0, 1)
        record.checks["answers_via_node_slowed"] = (
            fast is not None and slow is not None and slow - fast >= SLOW_RTT_MS
        )
        # The evidence: answers that crossed the link while it was slow and took at
        # least its added round trip more than a usual answer through the node before.
        floor = (fast or 0.0) + SLOW_RTT_MS
        record.notes[SLOWED] = float(
            sum(
                1
                for s in record.samples
                if s.status == "ok"
                and self.victim in s.nodes
                and slow_at <= s.started
                and s.ended <= healed
                and s.latency_ms >= floor
            )
        )
        down = [
            at
            for at, node, state in record.node_events
            if node == self.victim and state == "down" and at >= slow_at
        ]
        record.checks["no_node_down"] = not down

    def result(self, record: Record, short: bool = False) -> ScenarioResult:
        """The common figures, with the slowed answers (counted in :meth:`findings`,
        the only scenario whose evidence needs the victim) among the evidence."""
        figures = msgspec.to_builtins(super().result(record, short))
        figures["evidence"][SLOWED] = figures["notes"].pop(SLOWED, 0.0)
        figures["acceptance"] = judge(figures, self.expect)
        return msgspec.convert(figures, ScenarioResult)

    def meaning(self, r: ScenarioResult) -> str:
        n = r.notes
        telemetry = (
            f"telemetry's latency for it went from {num(n['telemetry_latency_ms_before'], 2)} "
            f"to {num(n['telemetry_latency_ms_while_slow'], 2)} ms"
            if "telemetry_latency_ms_while_slow" in n
            else "telemetry's view of it was not measured"
        )
        share = (
            f"its share of answers went from {num(n['share_via_node_before'], 3)} to "
            f"{num(n['share_via_node_while_slow'], 3)} while slow and "
            f"{num(n['share_via_node_after'], 3)} after"
            if "share_via_node_while_slow" in n
            else "its share of answers was not measured"
        )
        slowed = (
            f"answers through it took {num(n['median_ms_via_node_while_slow'], 1)} ms "
            f"(median) against {num(n['median_ms_via_node_before'], 1)} ms before"
            if "median_ms_via_node_while_slow" in n
            else "answers through it were not timed"
        )
        down = "no node-down" if r.checks.get("no_node_down") else "**a node-down**"
        return (
            f"{num(SLOW_RTT_MS, 0)}-{num(SLOW_RTT_MS + 2 * SLOW_JITTER_MS, 0)} ms more per "
            f"round trip on one node's link: {slowed}; {share}; {telemetry}; {down}."
        )
