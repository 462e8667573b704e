"""Admission control on a real nats-server: a pipeline at its limit makes requests wait
in line, a full line or a long wait is an honest ``rate_limited`` with a Retry-After, and
load never turns into a failover or an ``unrecoverable``.

The router runs in this process and the test plays the node, so it decides when each
stage is answered: the limit is seen at work, not inferred from timings.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus.server import NatsServer
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest, OutputReply
from hecate_router.limits import LimitOptions
from hecate_router.service import RouterService
from tests.services.router.test_router_defects import router_on, settled
from tests.support.waits import until

_reply = msgspec.json.Decoder(InferReply)
_log = logging.getLogger("hecate.test.admission")


@asynccontextmanager
async def router_with(
    server: NatsServer, nc: Client, *, limit: int, queue_limit: int, queue_timeout_s: float
) -> AsyncIterator[RouterService]:
    """One single-stage pipeline on node ``a``, whose limit is fixed (floor = ceiling) so
    that the test knows it."""
    async with router_on(
        server,
        nc,
        ["a"],
        limits=LimitOptions(initial=limit, floor=limit, ceiling=limit),
        queue_limit=queue_limit,
        queue_timeout_s=queue_timeout_s,
    ) as router:
        yield router


async def ask(nc: Client, inbox: str, prompt: str, tenant: str = "default") -> None:
    body = msgspec.json.encode(InferRequest(prompt=prompt, max_tokens=4, tenant=tenant))
    await nc.publish(subjects.infer("m"), body, reply=inbox)


async def answer(nc: Client, stage: Msg) -> None:
    await nc.publish(stage.reply, msgspec.msgpack.encode(OutputReply(output="done")))


async def test_requests_past_the_limit_wait_for_room_then_are_served(
    nats_server: NatsServer, client: Client
) -> None:
    async with router_with(
        nats_server, client, limit=2, queue_limit=8, queue_timeout_s=600.0
    ) as router:
        caller = await client.subscribe(client.new_inbox())
        nodes = await client.subscribe("hecate.node.*.run")
        for i in range(5):
            await ask(client, caller.subject, f"request {i}")
        await until(lambda: router.desk.counters["queued"] == 3, "three requests wait in line")
        await settled(router, client)
        assert nodes.pending_msgs == 2, "the pipeline got more than its limit"

        answered = 0
        while answered < 5:
            stage = await nodes.next_msg(timeout=5)
            await answer(client, stage)
            reply = _reply.decode((await caller.next_msg(timeout=5)).data)
            assert reply.ok, reply.error
            answered += 1
            await settled(router, client)
            assert router.desk.line.in_flight["m-a"] <= 2
        assert router.desk.counters["failovers"] == 0
        assert router.desk.flights == {}


async def test_a_full_line_is_refused_as_rate_limited_with_a_retry_after(
    nats_server: NatsServer, client: Client
) -> None:
    async with router_with(
        nats_server, client, limit=1, queue_limit=2, queue_timeout_s=600.0
    ) as router:
        caller = await client.subscribe(client.new_inbox())
        nodes = await client.subscribe("hecate.node.*.run")
        for i in range(4):  # one runs, two wait, the fourth finds the line full
            await ask(client, caller.subject, f"request {i}", tenant=f"t{i}")
        refused = await caller.next_msg(timeout=5)
        reply = _reply.decode(refused.data)
        assert not reply.ok
        assert reply.error is not None
        assert reply.error.code == "rate_limited"
        assert "busy" in reply.error.message
        assert reply.retry_after_s is not None
        assert reply.retry_after_s >= 1.0
        assert refused.headers is not None
        assert "Retry-After" in refused.headers

        for _ in range(3):  # the others are served, none lost
            await answer(client, await nodes.next_msg(timeout=5))
            assert _reply.decode((await caller.next_msg(timeout=5)).data).ok
        assert router.desk.counters["failovers"] == 0
        assert router.desk.counters["rate_limited_load"] == 1


async def test_a_request_that_waits_too_long_is_told_to_come_back(
    nats_server: NatsServer, client: Client
) -> None:
    async with router_with(
        nats_server, client, limit=1, queue_limit=8, queue_timeout_s=0.2
    ) as router:
        caller = await client.subscribe(client.new_inbox())
        nodes = await client.subscribe("hecate.node.*.run")
        await ask(client, caller.subject, "holds the pipeline")
        stage = await nodes.next_msg(timeout=5)
        await ask(client, caller.subject, "waits")
        reply = _reply.decode((await caller.next_msg(timeout=5)).data)
        assert reply.error is not None
        assert reply.error.code == "rate_limited"
        assert "waited" in reply.error.message
        await answer(client, stage)
        assert _reply.decode((await caller.next_msg(timeout=5)).data).ok
        assert router.desk.counters["failovers"] == 0
