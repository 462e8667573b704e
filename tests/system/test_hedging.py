"""A frozen router costs its callers a hedge, not their timeout, and runs nothing twice
when it wakes (client/hedge.py, services/retries.py)."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from hecate.bus.server import NatsServer
from hecate.client import HecateClient
from hecate.client.sdk import Attempt
from hecate.model.toy import reference
from hecate.wire import subjects
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    start_router,
    start_swarm,
    wait_until_serving,
)
from tests.support.waits import router_status, routers_ready, until

# The queue group hands each send to a member at random, a frozen one included: left to
# chance, the first send and every hedge can all land on the frozen router. So the test
# steers them. The frozen router logs in as a user of its own; it is the one router when
# the first send goes out, then a reload of the server's configuration takes its
# subscriptions to requests away (its connection stays open, the request it holds stays
# in its socket) and the healthy router joins: every hedge can only reach that one.
FROZEN = "frozen"
SERVING = ["hecate.infer.>", "hecate.stream.>"]


def authorization(frozen_serves: bool = True) -> str:
    deny = "" if frozen_serves else f", permissions: {{subscribe: {{deny: {json.dumps(SERVING)}}}}}"
    return (
        "no_auth_user: everyone\n"
        "authorization {\n"
        "  users = [\n"
        "    {user: everyone, password: everyone}\n"
        f"    {{user: {FROZEN}, password: {FROZEN}{deny}}}\n"
        "  ]\n"
        "}\n"
    )


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats", extra_config=authorization()).start()
    yield server
    server.stop()


@pytest.fixture
def frozen(nats_server: NatsServer, tmp_path: Path) -> Iterator[Processes]:
    url = nats_server.url.replace("nats://", f"nats://{FROZEN}:{FROZEN}@")
    procs = Processes(url=url, logs=tmp_path)  # its log beside the others
    yield procs
    procs.stop_all()


def _frozen_serves(server: NatsServer) -> bool:
    """Whether any connection of the frozen router's user still takes requests."""
    url = f"http://127.0.0.1:{server.monitor_port}/connz?subs=1&auth=1"
    with urllib.request.urlopen(url, timeout=5) as resp:
        connz = json.load(resp)
    return any(
        set(c.get("subscriptions_list") or ()) & set(SERVING)
        for c in connz["connections"]
        if c.get("authorized_user") == FROZEN
    )


async def _counters(client: Client, router_id: str) -> dict[str, int]:
    status = await router_status(client, router_id)
    assert status is not None, f"{router_id} does not answer"
    return {k: int(v) for k, v in status["counters"].items()}


async def test_a_request_held_by_a_frozen_router_is_answered_by_the_other_once(
    nats_server: NatsServer, processes: Processes, frozen: Processes, client: Client
) -> None:
    """router-1 is frozen (SIGSTOP: its connection stays open) with a request in its
    socket. The client hedges it, the hedge finds no live owner and router-2 runs it:
    answered right, the hedge recorded. Woken, router-1 finds what waited in its socket
    already answered by router-2 and runs none of it."""
    topology = EXAMPLES / "swarm.json"
    start_swarm(processes, topology, SWARM_NODES, routers=0)
    start_router(frozen, "router-1", topology)
    await wait_until_serving(client, "ncm-base")
    await routers_ready(client, "router-1")
    # The timeout is far beyond the hedge: an answer at all says the hedge did it. Room
    # for more hedges than the usual three: those sent before the reload took router-1
    # out wait in its socket beside the first send, still outstanding.
    sdk = HecateClient(client, timeout_s=30.0, max_attempts=1, max_outstanding=100)
    for i in range(3):  # a latency estimate: hedges come within a second, not at 15 s
        assert (await sdk.infer("ncm-base", f"warm {i}", max_tokens=4)).ok
    before = await _counters(client, "router-1")
    # The first send only (the server unsubscribes it after one): hedges that meet no
    # router at all come back at once, and the client hedges again, until router-2 is in.
    first = await client.subscribe(subjects.infer("ncm-base"), max_msgs=1)
    frozen.supervisor.kill("router-1", signal.SIGSTOP, wait=False)
    sends: list[Attempt] = []
    prompt = "frozen router"
    try:
        call = asyncio.create_task(
            sdk.infer("ncm-base", prompt, max_tokens=4, on_attempt=sends.append)
        )
        await first.next_msg(timeout=30)  # router-1, the one router, was handed it too
        nats_server.reload(authorization(frozen_serves=False))

        async def withdrawn() -> bool:
            return not await asyncio.to_thread(_frozen_serves, nats_server)

        await until(withdrawn, "router-1 out of the routers' queue group")
        start_router(processes, "router-2", topology)
        reply = await call
    finally:
        frozen.supervisor.kill("router-1", signal.SIGCONT, wait=False)
    assert reply.ok, reply.error
    assert reply.output == reference("ncm-base", 12, prompt, 4)
    assert sends[-1].replied, sends
    assert sends[-1].hedge, sends  # the hedge's answer won
    assert sends[0].code == "client_superseded", sends  # the first send was never answered

    async def woke_and_handed_over() -> bool:
        status = await router_status(client, "router-1")
        return status is not None and int(status["counters"].get("retries_handed_over", 0)) >= 1

    await until(woke_and_handed_over, "router-1 handing what it held over to its owner")
    after = await _counters(client, "router-1")
    assert after.get("answered", 0) == before.get("answered", 0), "router-1 ran nothing"
    assert after.get("stalls", 0) > before.get("stalls", 0)
