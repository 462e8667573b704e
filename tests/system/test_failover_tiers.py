"""Every failover tier with real processes: splice, degraded reserve, explicit error,
and a node that drains on SIGTERM.

As in test_faults: each step waits for the state it needs (answers counted, a node
called down, an event received), never for a length of time, and no test asserts a
duration.
"""

from __future__ import annotations

import signal
import time

from nats.aio.client import Client

from hecate.model.toy import reference
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent, NodeEvent
from tests.support.swarm import EXAMPLES, Processes, infer, start_swarm, wait_until_serving
from tests.support.waits import GENEROUS_S, router_status, until
from tests.system.load import start_load
from tests.system.test_faults import (
    BEYOND_THE_TEST_MS,
    collect,
    node_alive,
    plan,
    sign_of_death,
    telemetry,
)

RACKS = [
    ("rack1-a", 6, 5.0, 2.0),
    ("rack1-b", 6, 5.0, 2.0),
    ("rack2-a", 6, 7.0, 2.0),
    ("rack2-b", 6, 7.0, 2.0),
]


async def down(client: Client, node: str) -> None:
    async def gone() -> bool:
        return not await node_alive(client, node)

    await until(gone, f"telemetry calling {node} down")


async def test_two_losses_are_served_by_a_splice_bit_identical_to_the_reference(
    processes: Processes, client: Client
) -> None:
    """Under load, one node of each pipeline SIGKILLed (rack1-b, then rack2-a). Proves:
    nothing is lost, wrong or an error meanwhile, the load goes on being answered once
    both are down, and what serves is a splice of the two surviving halves (rack1-a and
    rack2-b), not degraded, its answer bit-identical to the reference."""
    start_swarm(processes, EXAMPLES / "splice.json", RACKS)
    await wait_until_serving(client, "ncm-base")
    load = start_load(client, "ncm-base", 12, workers=3)
    await load.answered(10, "the swarm under load before the kills")
    processes.kill("node-rack1-b")
    await down(client, "rack1-b")
    processes.kill("node-rack2-a")
    await down(client, "rack2-a")
    await load.answered(20, "served with one node of each pipeline gone")
    tally = await load.finish()
    assert (tally.lost, tally.wrong, tally.errors) == (0, 0, 0), tally
    reply = await infer(client, "ncm-base", "spliced", 12)
    assert reply.ok, reply.error
    assert reply.output == reference("ncm-base", 12, "spliced", 12)
    assert reply.route is not None
    assert reply.route.pipeline_id.endswith("~splice")
    assert [s.node_id for s in reply.route.stages] == ["rack1-a", "rack2-b"]
    assert reply.degraded is False


async def test_losing_the_only_base_copy_degrades_to_the_reserve_and_says_so(
    processes: Processes, client: Client
) -> None:
    """The only node holding the base model SIGKILLed. Proves: a request is answered by
    the reserve model, correctly for that model, and the reply says it is degraded."""
    start_swarm(
        processes,
        EXAMPLES / "degraded.json",
        [("gpu", 12, 3.5, 4.0), ("edge", 4, 9.0, 1.0)],
        pipelines=1,
    )
    await wait_until_serving(client, "ncm-base")
    processes.kill("node-gpu")
    await down(client, "gpu")
    reply = await infer(client, "ncm-base", "fallback please", 5)
    assert reply.ok, reply.error
    assert reply.degraded is True
    assert reply.route is not None
    assert reply.route.model_id == "ncm-mini"
    assert reply.output == reference("ncm-mini", 4, "fallback please", 5)


async def test_an_unrecoverable_loss_is_an_explicit_error_not_a_timeout(
    processes: Processes, client: Client
) -> None:
    """The only copy of layers 8-12 SIGKILLed, no splice or reserve possible. Proves:
    every request, before telemetry calls the node down and after, gets an explicit
    error naming the loss (unrecoverable, or no_healthy_pipeline once the router knows),
    never silence. The routers' stage timeout is set beyond the clients' own, so an
    answer can only come from a sign of the death (NATS's no-responders or telemetry's
    node-down), and every failover event says which."""
    start_swarm(
        processes,
        EXAMPLES / "unrecoverable.json",
        [("gpu", 8, 3.5, 4.0), ("laptop", 4, 12.0, 1.5), ("pi", 2, 40.0, 0.5)],
        pipelines=1,
        stage_timeout_ms=BEYOND_THE_TEST_MS,
        route_wait_ms=0,  # waiting for a route is test_faults.py's
    )
    await wait_until_serving(client, "ncm-base")
    failovers = await collect(client, subjects.EVENT_FAILOVER, FailoverEvent)
    downs = await collect(client, subjects.EVENT_NODE_DOWN, NodeEvent)
    processes.kill("node-laptop")
    deadline = time.monotonic() + GENEROUS_S
    after_down = 0
    while after_down < 3:  # from the kill on, then a few once telemetry has spoken
        known = any(d.node_id == "laptop" for d in downs)
        reply = await infer(client, "ncm-base", "anyone?", timeout=GENEROUS_S)
        assert reply.ok is False
        assert reply.error is not None
        assert reply.error.code in {"unrecoverable", "no_healthy_pipeline"}, reply.error
        if reply.error.code == "unrecoverable":
            assert "laptop" in reply.error.message, reply.error
        after_down += known
        assert time.monotonic() < deadline, "telemetry never called laptop down"
    mine = [e for e in failovers if e.lost_node == "laptop"]
    assert all(e.kind == "unrecoverable" for e in mine), mine
    assert all(sign_of_death(e.reason) for e in mine), sorted({e.reason for e in mine})


async def test_a_node_stopped_with_sigterm_drains_and_loses_nothing(
    processes: Processes, client: Client
) -> None:
    """The node at the head of the cheapest route stopped with SIGTERM under load.
    Proves: it drains (its log says so) and exits cleanly, nothing is lost, wrong or an
    error, and the swarm goes on answering without it."""
    start_swarm(
        processes,
        EXAMPLES / "swarm.json",
        [
            ("gpu", 12, 3.5, 4.0),
            ("laptop", 8, 12.0, 1.5),
            ("desktop", 6, 8.0, 2.0),
            ("pi", 4, 40.0, 0.5),
        ],
    )
    first = await wait_until_serving(client, "ncm-base")
    assert first.route is not None
    victim = first.route.stages[0].node_id
    load = start_load(client, "ncm-base", 12, workers=4)
    await load.answered(20, f"the swarm under load, {victim} on the cheapest route")
    processes.kill(f"node-{victim}", signal.SIGTERM)
    assert processes.procs[f"node-{victim}"].returncode == 0, "a drained node exits cleanly"
    await load.answered(20, f"served after {victim} left")
    tally = await load.finish()
    assert (tally.lost, tally.wrong, tally.errors) == (0, 0, 0), tally
    log = processes.log(f"node-{victim}")
    assert "draining" in log
    assert "stopped" in log


# Two disjoint 3-stage pipelines of the 12-layer model: a-b-c and d-e-f.
CHAIN_NODES = [
    ("a", 4, 5.0, 2.0),
    ("b", 4, 5.0, 2.0),
    ("c", 4, 5.0, 2.0),
    ("d", 4, 6.0, 2.0),
    ("e", 4, 6.0, 2.0),
    ("f", 4, 6.0, 2.0),
]


async def test_chained_dispatch_answers_correctly_and_survives_a_middle_node_kill(
    processes: Processes, client: Client
) -> None:
    """Chained dispatch (nodes forward to each other) on two 3-stage pipelines, the
    middle node of the serving one SIGKILLed under load. Proves: answers are the
    reference's, nothing is lost, wrong or an error, and the load goes on being answered
    once the node is down."""
    start_swarm(processes, EXAMPLES / "splice.json", CHAIN_NODES, dispatch="chain")
    first = await wait_until_serving(client, "ncm-base")
    assert first.route is not None
    assert len(first.route.stages) == 3
    assert first.output == reference("ncm-base", 12, "ready?", 8)
    # The first stage's count of the prompt rides down the chain to the last one's reply.
    assert (first.prompt_tokens, first.completion_tokens) == (1, 8)
    middle = first.route.stages[1].node_id
    load = start_load(client, "ncm-base", 12, workers=3)
    await load.answered(10, "chained dispatch under load before the kill")
    processes.kill(f"node-{middle}")
    await down(client, middle)
    await load.answered(20, f"served with {middle} down")
    tally = await load.finish()
    assert (tally.lost, tally.wrong, tally.errors) == (0, 0, 0), tally


async def router_holds_every_node(client: Client, router_id: str, node_ids: list[str]) -> None:
    """Until the plan places every one of ``node_ids``, telemetry's snapshot calls each
    alive, and the router holds that plan and a snapshot received since (nodes only
    join meanwhile, so every later one says the same)."""
    wanted = set(node_ids)
    epoch = 0

    async def all_placed_and_alive() -> bool:
        nonlocal epoch
        try:
            placed, revision = await plan(client)
            nodes = (await telemetry(client)).nodes
        except Exception:  # no plan or snapshot yet
            return False
        epoch = revision  # a router's plan epoch is the KV revision it adopted
        in_plan = {s.node_id for p in placed.pipelines for s in p.stages}
        return wanted <= in_plan and all(n in nodes and nodes[n].alive for n in wanted)

    await until(
        all_placed_and_alive, f"the plan placing {node_ids} and telemetry calling them alive"
    )
    seen_at = time.time()

    async def received() -> bool:
        status = await router_status(client, router_id)
        if status is None or status.get("telemetry_age_s") is None:
            return False
        fresh = time.time() - float(status["telemetry_age_s"]) >= seen_at
        return fresh and int(status["plan_epoch"]) >= epoch

    await until(received, f"{router_id} holding plan {epoch} and a snapshot since {seen_at}")


async def test_a_chained_stage_that_is_gone_is_named_by_the_node_that_forwarded_to_it(
    processes: Processes, client: Client
) -> None:
    """The middle node of both chained pipelines SIGKILLed, with telemetry stopped first
    and the routers' stage timeout beyond the test: nothing but NATS's no-responders can
    tell the router. Proves: the node that forwarded to a dead one passes that
    no-responders on, so the router names the right stage of each pipeline (b, then e)
    from it, without waiting for node-down or a timeout, and answers with an explicit
    unrecoverable error. (That is why it is fast: the figure is the README's, not this
    test's.)"""
    start_swarm(
        processes,
        EXAMPLES / "splice.json",
        CHAIN_NODES,
        dispatch="chain",
        stage_timeout_ms=BEYOND_THE_TEST_MS,
        route_wait_ms=0,  # waiting for a route is test_faults.py's
    )
    first = await wait_until_serving(client, "ncm-base")
    assert first.route is not None
    # One pipeline serving says nothing of the other's nodes: the router's last plan and
    # telemetry must hold all six, or the replica is missing because it had not joined
    # yet, not because of the kills.
    await router_holds_every_node(client, "router-1", [n for n, *_ in CHAIN_NODES])
    events = await collect(client, subjects.EVENT_FAILOVER, FailoverEvent)
    # No node-down can come: the router routes on its last telemetry, b and e alive.
    processes.kill("telemetry")
    # The middle stage of both pipelines: whichever the next request takes, its second
    # stage is gone, and so is the replica's.
    processes.kill("node-b")
    processes.kill("node-e")
    reply = await infer(client, "ncm-base", "ready?", timeout=GENEROUS_S)
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code == "unrecoverable", reply.error
    # The router publishes each failover event before the reply; the client may hand
    # them to this subscription after it.
    await until(lambda: len(events) >= 2, f"both failover events (so far {events})")
    assert {(e.lost_node, e.reason) for e in events} == {
        ("b", "no responders"),
        ("e", "no responders"),
    }, events
