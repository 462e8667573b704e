"""A frozen router costs its callers a hedge, not their timeout, and runs nothing twice
when it wakes (client/hedge.py, services/retries.py)."""

from __future__ import annotations

import signal

import pytest
from nats.aio.client import Client

from hecate.client import HecateClient
from hecate.client.sdk import Attempt
from hecate.model import reference

from .conftest import EXAMPLES, SWARM_NODES, Processes, start_swarm, wait_until_serving
from .waits import router_status, routers_ready, until


async def _counters(client: Client, router_id: str) -> dict[str, int]:
    status = await router_status(client, router_id)
    assert status is not None, f"{router_id} does not answer"
    return {k: int(v) for k, v in status["counters"].items()}


# Flaky by the policy's own worst case: when the first send and both hedges land on the
# frozen router (about one time in four), the caller waits out its timeout. Left to
# make test-heavy until the test steers its hedges.
@pytest.mark.heavy
async def test_a_request_held_by_a_frozen_router_is_answered_by_the_other_once(
    processes: Processes, client: Client
) -> None:
    """router-1 is frozen (SIGSTOP: its connection stays open, the queue group still
    hands it requests). A request it receives is hedged by the client, the hedge finds
    no live owner and router-2 runs it: answered right, the hedge recorded. Woken, router-1
    finds what waited in its socket already answered by router-2 and runs none of it."""
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=2)
    await wait_until_serving(client, "ncm-base")
    await routers_ready(client, "router-1", "router-2")
    before = await _counters(client, "router-1")
    # The timeout is far beyond the hedge: an answer at all says the hedge did it.
    sdk = HecateClient(client, timeout_s=30.0, max_attempts=1)
    processes.supervisor.kill("router-1", signal.SIGSTOP, wait=False)
    hedged: list[tuple[str, list[Attempt]]] = []
    try:
        for i in range(40):  # each lands on router-1 with even odds (queue group)
            sends: list[Attempt] = []
            prompt = f"frozen router {i}"
            reply = await sdk.infer("ncm-base", prompt, max_tokens=4, on_attempt=sends.append)
            assert reply.ok, reply.error
            assert reply.output == reference("ncm-base", 12, prompt, 4)
            if any(a.hedge for a in sends):
                hedged.append((prompt, sends))
                break
    finally:
        processes.supervisor.kill("router-1", signal.SIGCONT, wait=False)
    assert hedged, "no request reached the frozen router"
    _, sends = hedged[0]
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
