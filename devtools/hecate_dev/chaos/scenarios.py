"""The chaos scenarios, one object each (:class:`hecate_dev.chaos.scenario.Scenario`).
Each runs a fresh swarm of real processes on loopback (``topologies/chaos.json``,
shipped with this package: a 12-layer toy model on two 3-stage pipelines, a spare node
and a 4-layer reserve; two routers), waits until it serves, starts the load, lets it run
``warm`` seconds, injects its fault, heals it, and keeps the load on ``settle`` seconds
more (:mod:`hecate_dev.chaos.runner`). Acceptance, for every scenario (see
:mod:`hecate_dev.chaos.acceptance`): nothing lost, nothing wrong, no explicit error unless
the scenario names its code and why, no reserve answer beside an intact pipeline, and
the evidence its :class:`Expect` names that the fault hit live traffic.

The SmolLM2 scenarios, ``llm-kill`` and ``llm-overload``, are in
:mod:`hecate_dev.chaos.smollm2`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nats.aio.client import Client

from hecate.client.hedge import FLOOR_S
from hecate_dev.chaos import faults
from hecate_dev.chaos.acceptance import Expect
from hecate_dev.chaos.faults import Timing
from hecate_dev.chaos.freeze import NodeFreeze
from hecate_dev.chaos.harness import Swarm
from hecate_dev.chaos.links import NodeBlackhole, SlowLink
from hecate_dev.chaos.load import Record, summarize
from hecate_dev.chaos.partition import ServerPartition
from hecate_dev.chaos.results import ScenarioResult
from hecate_dev.chaos.scenario import Scenario, Unknown, failovers, num, retries, seconds, worst
from hecate_dev.chaos.setup import LLM, LLM_SETUP, Setup, topology
from hecate_dev.chaos.smollm2 import KILLED_NODE, LlmKill, LlmOverload

__all__ = [
    "SCENARIOS",
    "Scenario",
    "Setup",
    "Timing",
    "available",
    "figures",
    "of",
    "run",
    "topology",
]


class NodeKill(Scenario):
    """SIGKILL the middle node of the busiest pipeline; restart it later."""

    name = "node-kill"
    expect = KILLED_NODE

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        await faults.node_kill(swarm, nc, record, t)

    def meaning(self, r: ScenarioResult) -> str:
        return (
            "the requests in flight on the killed node fail over to the replica within "
            "milliseconds (no-responders); one killed while computing waits for "
            f"telemetry's node-down. This run: {failovers(r)} failovers, {worst(r)}."
        )


class RouterKill(Scenario):
    """Freeze one of the two routers (SIGSTOP) long enough that requests are certainly
    waiting on it, then SIGKILL it; restart it later. Judged against a target: the
    service looks normal again within ``RECOVER_S`` and no caller waits more than
    ``WORST_WAIT_S`` for its answer (the callers' timeout is 2 s)."""

    name = "router-kill"
    RECOVER_S = 1.0
    WORST_WAIT_S = 1.5
    expect = Expect(
        ("client_retries", "recover_s"),
        "the requests the frozen router holds get no reply: their callers hedge them "
        "to the other router, which finds no live owner and runs them",
    )

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        await faults.router_kill(swarm, nc, record, t)

    def findings(self, record: Record) -> None:
        recover = float(summarize(self.name, record)["recover_s"])
        worst_wait = max((s.ended - s.started for s in record.samples), default=0.0)
        record.notes["worst_wait_s"] = round(worst_wait, 3)
        record.notes["hedges"] = float(sum(s.hedges for s in record.samples))
        record.checks[f"recovered_within_{self.RECOVER_S:g}_s"] = recover <= self.RECOVER_S
        record.checks[f"no_caller_waited_over_{self.WORST_WAIT_S:g}_s"] = (
            worst_wait <= self.WORST_WAIT_S
        )

    def meaning(self, r: ScenarioResult) -> str:
        hedges = int(r.notes.get("hedges", 0))
        return (
            "the router is frozen a moment before it is killed, so that it certainly "
            "holds requests when it dies; their callers hear nothing for a few times "
            f"their usual latency (at least {FLOOR_S} s) and send again ({hedges:,} "
            "hedges), keeping the first send; the other router finds no live owner "
            f"within its claim window and runs it. Worst wait {seconds(r.max_ms)} "
            f"(target ≤ {self.WORST_WAIT_S} s), recovered in {num(r.recover_s, 2)} s "
            f"(target ≤ {self.RECOVER_S} s)."
        )


class ControlPlane(Scenario):
    """SIGKILL the planner, then telemetry, then the breaker service, one at a time,
    each restarted before the next: routers serve from their last snapshots."""

    name = "control-plane"
    expect = Expect(
        ("answered_during_outages",),
        "none of the three is on the request path: what must show is requests "
        "answered from start to end while each one was down",
    )

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        await faults.control_plane(swarm, nc, record, t)

    def meaning(self, r: ScenarioResult) -> str:
        return (
            "the planner, telemetry and the breaker service are each killed and restarted "
            f"in turn; routers serve from their last snapshots meanwhile ({worst(r)})."
        )


class NatsRestart(Scenario):
    """SIGKILL the nats-server and start it again on the same port and JetStream store:
    every service reconnects, the plan survives, service resumes."""

    name = "nats-restart"
    expect = Expect(
        ("recover_s",),
        "nothing is answered while the only server is down (about a second), so "
        "every request in flight then takes far longer than 3x the pre-fault p99 "
        "(the routers resend what they hold once reconnected, so callers need not "
        "retry)",
        allowed_send_failures={
            "client_timeout": "a request the server had taken in and not yet passed on "
            "when it was killed dies with it: its caller's own timeout ends that send, "
            "and the caller sends again once reconnected"
        },
    )

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        await faults.nats_restart(swarm, nc, record, t)

    def meaning(self, r: ScenarioResult) -> str:
        survived = r.checks.get("plan_survived")
        return (
            "the server is down about a second; the requests in flight wait it out (the "
            "routers resend what they hold once reconnected; callers retried "
            f"{retries(r)}; max {seconds(r.max_ms)}). The plan in JetStream "
            f"{'survived' if survived else '**did not survive**'} the restart. A restart "
            "once turned into wrong verdicts (telemetry counted its own cut-off time as "
            "the nodes' silence; routers met no-responders from nodes not yet "
            "resubscribed); both are fixed, and this scenario keeps them fixed."
        )


class SickNode(Scenario):
    """A node stays up but each stage takes ten times its declared latency, then fails
    with an error, then heals (injected over ``hecate.node.<id>.fault``; chaos swarms
    start nodes with ``--accept-faults``): telemetry sees it slow, load moves off it,
    its circuit opens, and closes again."""

    name = "sick-node"
    expect = Expect(
        ("failover_events",),
        "stages the node refuses with an error fail over to the replica (and open its circuit)",
    )

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        await faults.sick_node(swarm, nc, record, t)

    def meaning(self, r: ScenarioResult) -> str:
        notes = r.notes
        seen = notes.get("telemetry_latency_ms_while_slow")
        delay = notes.get("injected_delay_ms")
        telemetry = (
            f"telemetry's latency for it rose to {num(seen, 1)} ms (stages delayed "
            f"{num(delay, 0)} ms)"
            if seen is not None and delay is not None
            else "telemetry's view of it was not measured"
        )
        before = notes.get("share_via_node_before")
        during = notes.get("share_via_node_while_slow")
        closed = notes.get("breaker_closed_s_after_heal")
        share = (
            f"the node's share of answers went from {num(before, 3)} to {num(during, 3)}"
            if before is not None and during is not None
            else "the node's share of answers was not measured"
        )
        heal = (
            f"one probe closed it {num(closed, 2)} s after the heal"
            if closed is not None
            else "it did **not** close after the heal"
        )
        opened = "opened" if r.checks.get("breaker_opened") else "**did not open**"
        return (
            f"10x slower, {telemetry} and {share}; answering errors, its circuit "
            f"{opened} (the chaos swarm runs the breaker with `--failure-threshold 3 "
            f"--cooldown-s 2`); healed, {heal}. Error replies fail over to the replica: "
            f"callers saw {r.errors:,} errors."
        )


class NatsCluster(Scenario):
    """Three routed nats-servers; SIGKILL the one the callers are on."""

    name = "nats-cluster"
    expect = Expect(
        ("recover_s",),
        "the killed server is the callers' own: no request they have in flight can "
        "be answered before their connection has moved to another server",
        allowed_send_failures={
            "client_timeout": "a request the killed server had taken in and not yet "
            "passed on dies with it: its caller's own timeout ends that send, and the "
            "caller sends again on the server its connection moved to"
        },
    )
    setup = Setup(cluster=3)

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        await faults.cluster_member_kill(swarm, nc, record, t)

    def meaning(self, r: ScenarioResult) -> str:
        return (
            "the server killed is the callers' own; they and the services connected to "
            "it reconnect to the other two (clients are given the whole list); a request "
            "in flight waits for its caller's connection to move, or for a stage timeout "
            f"where a node's did (callers retried {retries(r)}; max {seconds(r.max_ms)}). "
            "The plan stays readable from the two survivors (KV with 3 replicas)."
        )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        NodeKill(),
        NodeFreeze(),
        NodeBlackhole(),
        SlowLink(),
        RouterKill(),
        ControlPlane(),
        NatsRestart(),
        SickNode(),
        NatsCluster(),
        ServerPartition(),
        LlmKill(),
        LlmOverload(),
    )
}


def of(name: str) -> Scenario:
    """The scenario by name; one a saved run names that is gone judges as no more than
    no loss and no error."""
    return SCENARIOS.get(name) or Unknown(name)


def available(name: str) -> bool:
    """False for a scenario whose model is not in the local cache."""
    if SCENARIOS[name].setup.topology == LLM_SETUP.topology:
        from hecate.llm.store import present

        return present(LLM)
    return True


def figures(name: str, record: Record) -> ScenarioResult:
    """A scenario's figures from its record, with what it must show and every
    criterion of its acceptance judged."""
    return SCENARIOS[name].result(record)


async def run_scenario(
    name: str,
    *,
    short: bool = False,
    workdir: Path | None = None,
    plot: Path | None = None,
    keep_timeline: bool = False,
) -> ScenarioResult:
    """Run one scenario on a fresh swarm (see :func:`hecate_dev.chaos.runner.run`)."""
    from hecate_dev.chaos.runner import run as run_on_swarm

    return await run_on_swarm(
        SCENARIOS[name], short=short, workdir=workdir, plot=plot, keep_timeline=keep_timeline
    )


async def run(name: str, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_scenario`'s figures as the JSON ``--json`` prints them."""
    return (await run_scenario(name, **kwargs)).figures()
