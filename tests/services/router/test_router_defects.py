"""The router's races, on a real nats-server: one answer per request whatever order its
outcomes arrive in, exactly one probe through a half-open target on every route,
failure reports kept across a reconnect until a breaker service hears them, and no more
than a few retries held waiting for one running request.

The router runs in this process so that the test can play its nodes (and, for the probe,
the breaker service's lease desk) on the bus, and can take the very decision the sweep
or the node-down handler takes (a list of (flight, send) taken before it awaits
anything) at the moment it wants.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from hecate.bus import kv as kvs
from hecate.bus import settle
from hecate.bus.backlog import Backlog
from hecate.bus.server import NatsServer
from hecate.bus.service import connect
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.resilience.breaker import BreakerSnapshot
from hecate.wire import subjects
from hecate.wire.messages import (
    ErrorBody,
    ErrorReply,
    InferReply,
    InferRequest,
    NodeEvent,
    ProbeGrant,
    RetryClaim,
    RetryOwner,
)
from hecate.wire.stages import OutputReply, StageReply, StepStage
from hecate_planner.planstore import publish_by_hand
from hecate_router.breakers import BreakerView
from hecate_router.desk_flow import Dispatch, StageHeard
from hecate_router.flow import Failure, FailureKind, Send
from hecate_router.service import RouterConfig, RouterService
from tests.support.swarm import Processes
from tests.support.waits import until

_reply = msgspec.json.Decoder(InferReply)
_log = logging.getLogger("hecate.test.router")

# One model, one single-stage pipeline per node; declared latencies order the routes:
# a is the cheapest, then t, then c (all slower than the cold penalty, so they count).
LATENCY_MS = {"a": 300.0, "t": 600.0, "c": 3000.0}


def plan_of(nodes: list[str]) -> SwarmPlan:
    return SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id="m", layers=4),),
        nodes=tuple(
            NodeProfile(node_id=n, capacity_layers=4, latency_ms=LATENCY_MS[n]) for n in nodes
        ),
        pipelines=tuple(
            Pipeline(
                pipeline_id=f"m-{n}",
                model_id="m",
                stages=(Stage(node_id=n, layer_start=0, layer_end=4),),
            )
            for n in nodes
        ),
    )


async def serving(nc: Client, router: RouterService) -> bool:
    """The router takes requests (a model it cannot route gets its error) with a plan."""
    try:
        await nc.request(subjects.infer("no-such-model"), b"{}", timeout=1)
    except Exception:
        return False
    return router.view.router is not None


@asynccontextmanager
async def router_on(
    server: NatsServer, nc: Client, nodes: list[str], **options: Any
) -> AsyncIterator[RouterService]:
    """A router in this process on a plan of ``nodes``; ``options`` go to RouterService."""
    await publish_by_hand(nc, plan_of(nodes))
    # Stages never time out by themselves here: the test decides when a sweep happens.
    config = RouterConfig(instance_id="r1", stage_timeout_s=600.0, **options)
    router = RouterService(config, log=_log)
    stop = asyncio.Event()
    task = asyncio.create_task(router.run(server.url, stop, grace=2.0))
    try:
        await until(lambda: serving(nc, router), "the router serves")
        yield router
    finally:
        stop.set()
        await task


async def ask(nc: Client, inbox: str, prompt: str) -> None:
    body = msgspec.json.encode(InferRequest(prompt=prompt, max_tokens=4))
    await nc.publish(subjects.infer("m"), body, reply=inbox)


async def answer(nc: Client, stage: Msg, reply: StageReply | ErrorReply) -> None:
    await nc.publish(stage.reply, msgspec.msgpack.encode(reply))


async def settled(router: RouterService, nc: Client) -> None:
    """Everything the router published has reached this connection's subscriptions:
    the router's connection flushed (the server has it), then ours (it was delivered)."""
    await settle.settled(router.service.nc)
    await settle.settled(nc)


def node_of(stage: Msg) -> str:
    return stage.subject.split(".")[2]  # hecate.node.<id>.run


DONE = OutputReply(output="done")


# -- one answer per request (a flight that answered is never failed over) ----------------


@pytest.mark.parametrize("decided_by", ["node-down", "sweep"])
async def test_a_failure_decided_before_the_reply_landed_is_not_acted_on_after_it(
    nats_server: NatsServer, client: Client, decided_by: str
) -> None:
    """The order that used to answer twice: the node-down handler (or the sweep) takes
    its list of flights to fail over, the stage's reply lands and the flight answers,
    then the handler gets to that flight. With one attempt allowed, acting on it would
    answer the caller a second time (an error after the answer); it must do nothing."""
    async with router_on(nats_server, client, ["a", "t"], max_attempts=1) as router:
        caller = await client.subscribe(client.new_inbox())
        nodes = await client.subscribe("hecate.node.*.run")
        await ask(client, caller.subject, "one answer")
        stage = await nodes.next_msg(timeout=5)
        assert node_of(stage) == "a"

        # The send each flight awaits, as the handler saw it before the reply landed.
        decided = [(k, f.machine.send) for k, f in router.desk.flights.items()]
        assert len(decided) == 1
        await answer(client, stage, DONE)
        first = _reply.decode((await caller.next_msg(timeout=5)).data)
        assert first.ok, first.error

        kind: FailureKind = "node_down" if decided_by == "node-down" else "timeout"
        for flight, send in decided:  # what the handler does next with its list
            failure = Failure(kind, f"{decided_by}: after the reply")
            await router.feed(StageHeard(flight, send, 0, failure, time.monotonic()))
        await settled(router, client)

        assert caller.pending_msgs == 0, "the caller got a second answer"
        assert nodes.pending_msgs == 0, "the answered request was sent again"
        assert router.desk.counters["stale_failures"] == 1
        assert router.desk.counters["failovers"] == 0
        assert router.desk.flights == {}
        assert router.view.router is not None
        assert router.view.router.in_flight() == 0


async def test_a_reply_after_the_node_down_failover_is_late_and_the_rescue_answers_once(
    nats_server: NatsServer, client: Client
) -> None:
    """The other order, on the router's own subscriptions: telemetry's node-down event
    fails the flight over first; the dead node's reply, arriving after all, is late."""
    async with router_on(nats_server, client, ["a", "t"]) as router:
        caller = await client.subscribe(client.new_inbox())
        nodes = await client.subscribe("hecate.node.*.run")
        await ask(client, caller.subject, "rescued once")
        on_a = await nodes.next_msg(timeout=5)
        assert node_of(on_a) == "a"

        down = NodeEvent(node_id="a", state="down", reason="heartbeats stopped", at=time.time())
        await client.publish(subjects.EVENT_NODE_DOWN, msgspec.json.encode(down))
        on_t = await nodes.next_msg(timeout=5)  # the node-down handler rerouted it
        assert node_of(on_t) == "t"

        await answer(client, on_a, DONE)  # the "dead" node answers after all
        await answer(client, on_t, OutputReply(output="rescued"))
        only = _reply.decode((await caller.next_msg(timeout=5)).data)
        await settled(router, client)

        assert only.ok, only.error
        assert only.output == "rescued"
        assert caller.pending_msgs == 0, "the caller got a second answer"
        assert router.desk.counters["late_replies"] == 1
        assert router.desk.counters["failovers"] == 1
        assert router.view.router is not None
        assert router.view.router.in_flight() == 0


# -- exactly one probe through a half-open target -----------------------------------------


async def lease_desk(nc: Client, target: str) -> Subscription:
    """The breaker service's probe desk, granting ``target``'s probe to whoever asks."""

    async def grant(msg: Msg) -> None:
        grant = ProbeGrant(target=target, granted=True, state="half_open")
        await nc.publish(msg.reply, msgspec.json.encode(grant))

    return await nc.subscribe(subjects.BREAKER_PROBE, cb=grant)


async def test_a_failover_onto_a_half_open_target_carries_its_one_probe(
    nats_server: NatsServer, client: Client
) -> None:
    """A request is on a when the router wins t's probe lease; a fails it over onto t,
    so that request is t's probe. The next request must not go to t as a second one."""
    breakers = await kvs.bucket(client, subjects.BREAKER_BUCKET)
    cooled = BreakerSnapshot(state="open", open_until=time.time() - 1, trips=1)
    await breakers.put("t", msgspec.json.encode(cooled))
    async with router_on(nats_server, client, ["a", "t", "c"]) as router:
        view = router.view.breakers
        assert view is not None
        caller = await client.subscribe(client.new_inbox())
        nodes = await client.subscribe("hecate.node.*.run")
        reports = await client.subscribe(subjects.breaker_report("t"))

        await ask(client, caller.subject, "fails over onto t")
        on_a = await nodes.next_msg(timeout=5)
        assert node_of(on_a) == "a"  # no breaker service has answered: t is shut
        await lease_desk(client, "t")  # asked again, now answered
        await until(lambda: "t" in view.leased, "the router won t's probe lease")
        await answer(client, on_a, ErrorReply(error=ErrorBody(code="x", message="x")))
        probe = await nodes.next_msg(timeout=5)
        assert node_of(probe) == "t", "the rescue goes through t, the probe"

        await ask(client, caller.subject, "while the probe is out")
        second = await nodes.next_msg(timeout=5)
        assert node_of(second) == "c", "a second request went to the half-open target"
        await answer(client, second, DONE)
        await answer(client, probe, DONE)
        for _ in range(2):
            assert _reply.decode((await caller.next_msg(timeout=5)).data).ok
        await settled(router, client)

        assert nodes.pending_msgs == 0
        assert view.leases_won == 1
        assert view.leased == set()
        assert view.probing == set()
        outcome = msgspec.json.decode((await reports.next_msg(timeout=5)).data)
        assert outcome["ok"] is True, "the probe's outcome is reported, once"
        assert reports.pending_msgs == 0


async def test_a_probe_rerouted_around_its_target_is_given_back(
    nats_server: NatsServer, client: Client
) -> None:
    """A request carrying t's probe that fails over away from t never delivers it:
    the router stops waiting for an outcome that cannot come (else it never asks for
    t's probe again)."""
    breakers = await kvs.bucket(client, subjects.BREAKER_BUCKET)
    cooled = BreakerSnapshot(state="open", open_until=time.time() - 1, trips=1)
    await breakers.put("t", msgspec.json.encode(cooled))
    await lease_desk(client, "t")
    async with router_on(nats_server, client, ["t", "c"]) as router:
        view = router.view.breakers
        assert view is not None
        await until(lambda: "t" in view.leased, "the router won t's probe lease")
        caller = await client.subscribe(client.new_inbox())
        nodes = await client.subscribe("hecate.node.*.run")

        await ask(client, caller.subject, "the probe")
        probe = await nodes.next_msg(timeout=5)
        assert node_of(probe) == "t"
        assert view.probing == {"t"}
        # t never got it (NATS said no responders): the rescue goes to c instead.
        for key, flight in list(router.desk.flights.items()):
            failure = Failure("no_responders", "no responders")
            await router.feed(StageHeard(key, flight.machine.send, 0, failure, time.monotonic()))
        rescue = await nodes.next_msg(timeout=5)
        assert node_of(rescue) == "c"
        assert view.probing == set(), "the undelivered probe is still awaited"
        await answer(client, rescue, DONE)
        assert _reply.decode((await caller.next_msg(timeout=5)).data).ok


# -- failure reports kept across a reconnect -----------------------------------------------


async def restart_on_same_port(server: NatsServer) -> None:
    port = server.client_port
    server.stop()
    server.port, server.client_port = port, 0
    await asyncio.to_thread(server.start)


async def nats_server_down(server: NatsServer, nc: Client) -> None:
    server.stop()
    await until(lambda: not nc.is_connected, "the client noticed the server is gone")


async def test_failure_reports_made_while_disconnected_reach_the_breaker_after_reconnect(
    nats_server: NatsServer, processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    """A router loses its server, records five failures of t with room for three, and
    gets its server back: the two oldest are counted and logged as dropped; the three
    kept wait while no breaker service is there to hear them (a no-responders bounce,
    not a silent loss) and reach it once one is."""
    caplog.set_level(logging.INFO, logger=_log.name)
    nc = await connect(nats_server.url, "router-under-test")
    observer = await nats.connect(nats_server.url, max_reconnect_attempts=-1)
    counters: Counter[str] = Counter()
    view = BreakerView(
        lambda: nc,
        router_id="r-test",
        probe_timeout_s=10.0,
        log=_log,
        counters=counters,
        backlog=Backlog(max_age_s=30.0, max_len=3),
    )
    try:
        await nats_server_down(nats_server, nc)
        for i in range(5):
            await view.report("t", ok=False, code=f"timeout{i}")
        assert len(view.backlog) == 3
        assert counters["breaker_reports_dropped"] == 2
        dropped = [r for r in caplog.records if r.getMessage() == "breaker reports dropped"]
        assert dropped
        assert dropped[0].levelno == logging.WARNING

        await restart_on_same_port(nats_server)
        await until(lambda: nc.is_connected and observer.is_connected, "reconnected")
        assert await view.deliver() == 0, "delivered with no breaker service to hear it"
        assert len(view.backlog) == 3

        processes.start("breaker", "breaker", "--id", "breaker")
        heard: list[int] = []

        async def all_heard() -> bool:  # what the router's sweep does, tick after tick
            heard.append(await view.deliver())
            return not view.backlog

        await until(all_heard, "the breaker service heard the kept reports")
        assert sum(heard) == 3, heard
        assert counters["breaker_reports_redelivered"] == 3

        # The breaker service's own count of the reports it took in (what it then does
        # with them is its business, tested with it).
        stats: list[object] = []

        async def three_reports_taken() -> bool:
            msg = await observer.request(
                f"$SRV.STATS.{subjects.SERVICE_NAMES['breaker']}", b"", timeout=2
            )
            doc = json.loads(msg.data)
            taken = next(e["num_requests"] for e in doc["endpoints"] if e["name"] == "report")
            stats[:] = [taken]
            return bool(taken == 3)

        await until(three_reports_taken, "the breaker service took the three", last=stats)
    finally:
        await nc.close()
        await observer.close()


# -- retries held by a running request ---------------------------------------------------


async def again(nc: Client, inbox: str, attempt: int) -> None:
    """The same request (tenant and request_id) as ``attempt`` of it."""
    body = InferRequest(prompt="held", max_tokens=4, request_id="rid-9", attempt=attempt)
    await nc.publish(subjects.infer("m"), msgspec.json.encode(body), reply=inbox)


async def test_retries_of_a_running_request_wait_for_it_up_to_a_cap_and_the_rest_are_told(
    nats_server: NatsServer, client: Client
) -> None:
    """A client retrying in a loop (or many clients sharing a request_id) while the first
    attempt runs: each retry joined waits for the answer, held by the router and never
    asked of the quota desk or the line, so only the first few (8 by default) are held,
    here or for another replica that claimed them, and every later one is answered
    ``rate_limited`` at once, saying why."""
    async with router_on(nats_server, client, ["a"]) as router:
        nodes = await client.subscribe("hecate.node.*.run")
        callers = [await client.subscribe(client.new_inbox()) for _ in range(14)]
        await again(client, callers[0].subject, 1)
        stage = await nodes.next_msg(timeout=5)  # the test is the node: it runs until told
        for i in range(1, 7):  # six retries reach this replica
            await again(client, callers[i].subject, i + 1)
        await until(lambda: router.desk.counters["retries_joined"] == 6, "six retries joined")
        owners = []
        for i in range(7, 11):  # four reached another replica, which asks who owns them
            claim = RetryClaim(tenant="default", request_id="rid-9", reply_to=callers[i].subject)
            msg = await client.request(subjects.ROUTER_RETRIES, msgspec.json.encode(claim), 5)
            owners.append(msgspec.json.decode(msg.data, type=RetryOwner).router_id)
        assert owners == ["r1"] * 4, "a claimed retry would be run on the other replica"
        for i in range(11, 14):  # and three more here
            await again(client, callers[i].subject, i + 1)
        over = callers[9:]  # past the cap: the last two claimed and the last three here
        await until(
            lambda: all(c.pending_msgs == 1 for c in over),
            "the retries past the cap are answered while the request still runs",
            timeout=5,
            last=[c.pending_msgs for c in callers],
        )
        refused = [_reply.decode((await c.next_msg(timeout=1)).data) for c in over]

        await answer(client, stage, DONE)
        held = [_reply.decode((await c.next_msg(timeout=5)).data) for c in callers[:9]]
        await settled(router, client)

        assert [(r.ok, r.output) for r in held] == [(True, "done")] * 9
        for r in refused:
            assert r.error is not None
            assert r.error.code == "rate_limited"
            assert r.error.message.startswith(
                "8 retries of this request already wait for its answer"
            ), r.error.message
            assert r.retry_after_s is not None
            assert 0 < r.retry_after_s <= 2
            assert r.request_id == "rid-9"
        assert all(c.pending_msgs == 0 for c in callers), "a caller got a second answer"
        assert nodes.pending_msgs == 0, "the request ran twice"
        assert router.desk.counters["retries_joined"] == 8
        assert router.desk.counters["retries_refused_full"] == 5

        late = await client.subscribe(client.new_inbox())  # its answer is remembered
        await again(client, late.subject, 15)
        assert _reply.decode((await late.next_msg(timeout=5)).data).output == "done"


# -- one request's data fails that request alone ------------------------------------------


async def test_a_stage_that_will_not_encode_fails_its_request_alone_and_the_router_goes_on(
    nats_server: NatsServer, client: Client
) -> None:
    """A stage message no encoder can carry (a number past msgpack's range, which the
    wire's bounds now refuse at the request's decode): the dispatch comes back as the
    request's own failure, answered bad_request, never failed over nor blamed on the
    node, and the router serves the next request."""
    async with router_on(nats_server, client, ["a", "t"]) as router:
        caller = await client.subscribe(client.new_inbox())
        nodes = await client.subscribe("hecate.node.*.run")
        await ask(client, caller.subject, "unsendable")
        await nodes.next_msg(timeout=5)
        [(flight, machine)] = [(k, f.machine) for k, f in router.desk.flights.items()]
        step = StepStage(
            request_id="r",
            model_id="m",
            layer_start=0,
            layer_end=4,
            model_layers=4,
            session="s",
            seed=2**64,  # built past the decoder's bound, as only a bug could
        )
        send = Send(send=machine.send, stage=0, node_id="a", request=step, chained=0)
        back = await router.publisher.carry_out([Dispatch(flight, 1, send)])
        [heard] = back
        assert isinstance(heard, StageHeard)
        assert isinstance(heard.outcome, Failure)
        assert heard.outcome.kind == "unsendable"
        await router.feed(heard)
        refused = _reply.decode((await caller.next_msg(timeout=5)).data)
        assert not refused.ok
        assert refused.error is not None
        assert refused.error.code == "bad_request"
        assert "cannot be encoded" in refused.error.message
        assert router.desk.counters["failovers"] == 0
        assert router.view.router is not None
        assert router.view.router.in_flight() == 0

        await ask(client, caller.subject, "next")
        stage = await nodes.next_msg(timeout=5)
        await answer(client, stage, DONE)
        after = _reply.decode((await caller.next_msg(timeout=5)).data)
        assert after.ok, after.error
