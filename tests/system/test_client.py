"""The async client SDK against real services."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import msgspec
import nats
from nats.aio.client import Client

from hecate.bus.server import NatsServer
from hecate.client import HecateClient
from hecate.client.sdk import Attempt
from hecate.model.toy import reference
from hecate.resilience.backoff import SeedPolicy
from hecate.wire.messages import InferReply, InferRequest
from hecate_dev.chaos.acceptance import classify
from tests.support.swarm import EXAMPLES, SWARM_NODES, Processes, start_swarm, wait_until_serving
from tests.support.waits import router_infer_stats, routers_up


async def router_counters(client: Client) -> dict[str, int]:
    msg = await client.request("$SRV.STATS.hecate-router", b"", timeout=2)
    data = next(e["data"] for e in json.loads(msg.data)["endpoints"] if e["name"] == "infer")
    return dict(data["counters"])


async def test_a_refused_caller_comes_back_at_its_slot_with_its_ticket_and_is_served(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"tenants": {"acme": {"requests_per_min": 60, "burst": 1}}}))
    processes.start("breaker", "breaker", "--id", "breaker", "--quotas", str(quotas))
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=0)
    processes.start("router-1", "router", "--id", "router-1", "--enforce-quotas")
    await wait_until_serving(client, "ncm-base")
    sdk = HecateClient(client, policy=SeedPolicy(1), max_attempts=3)
    started = time.monotonic()
    first, second = await asyncio.gather(
        sdk.infer("ncm-base", "one", tenant="acme"), sdk.infer("ncm-base", "two", tenant="acme")
    )
    assert first.ok, first.error
    assert second.ok, second.error  # refused once, then served in its own slot
    assert time.monotonic() - started >= 1.0  # it waited for its turn (60/min, burst 1)
    assert (first.attempts, second.attempts) == (1, 1)  # one execution each
    counters = await router_counters(client)
    assert counters.get("quota_refused") == 1, counters


async def test_a_retried_request_is_not_executed_twice(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=1)
    await wait_until_serving(client, "ncm-base")
    sdk = HecateClient(client)
    sends: list[Attempt] = []
    a = await sdk.infer("ncm-base", "exactly once", request_id="req-42", on_attempt=sends.append)
    b = await sdk.infer("ncm-base", "exactly once", request_id="req-42")  # a client retry
    assert a.ok
    assert sends == [Attempt(1, replied=True, code="")]
    assert a == b
    assert a.output == reference("ncm-base", 12, "exactly once", 16)
    counters = await router_counters(client)
    assert counters.get("retries_answered_again") == 1, counters
    assert counters.get("answered", 0) >= 1


async def test_with_no_router_the_client_fails_fast_once_its_breaker_opens(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    sdk = HecateClient(
        nc, timeout_s=0.5, max_attempts=1, breaker_threshold=3, breaker_cooldown_s=30
    )
    sends: list[list[Attempt]] = [[] for _ in range(5)]
    codes = [
        (await sdk.infer("ncm-base", f"anyone {i}", on_attempt=sends[i].append)).error
        for i in range(5)
    ]
    await nc.close()
    assert [c.code if c else None for c in codes] == [
        "client_no_router",
        "client_no_router",
        "client_no_router",
        "client_breaker_open",
        "client_breaker_open",
    ]
    # What went out on the wire: one unanswered send each, then nothing at all.
    assert [[(a.replied, a.code) for a in s] for s in sends] == [
        [(False, "client_no_router")],
        [(False, "client_no_router")],
        [(False, "client_no_router")],
        [],
        [],
    ]


async def test_a_call_the_client_breaker_cuts_short_after_silence_is_lost(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    sdk = HecateClient(
        nc,
        timeout_s=0.5,
        max_attempts=4,
        policy=SeedPolicy(1),
        breaker_threshold=2,
        breaker_cooldown_s=30,
    )
    sends: list[Attempt] = []
    reply = await sdk.infer("ncm-base", "anyone?", on_attempt=sends.append)
    await nc.close()
    assert reply.error is not None
    assert reply.error.code == "client_breaker_open"  # the client's last word...
    assert [a.replied for a in sends] == [False, False]  # ...after two unanswered sends
    assert classify(reply.ok, False, sends, reply.error.code) == ("lost", "client_breaker_open")


async def test_a_retry_reaching_another_replica_is_answered_by_the_owner_not_run_again(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=2)
    await wait_until_serving(client, "ncm-base")
    await routers_up(client, 2)

    async def answered() -> int:
        every = await router_infer_stats(client, 2, 10.0)
        assert len(every) == 2, f"{len(every)} of 2 routers answered $SRV.STATS"
        return sum(int(data["counters"].get("answered", 0)) for data in every)

    before = await answered()
    first = await HecateClient(client).infer("ncm-base", "only once", request_id="rid-7")
    assert first.ok
    replies = []
    for attempt in range(2, 10):  # retries land on either replica (queue group)
        body = InferRequest(prompt="only once", request_id="rid-7", attempt=attempt)
        msg = await client.request("hecate.infer.ncm-base", msgspec.json.encode(body), timeout=5)
        replies.append(msgspec.json.decode(msg.data, type=InferReply))
    assert all(r == first for r in replies)
    assert await answered() == before + 1, "executed once, however many retries"
