"""Tenant quotas: one shared budget across router replicas, each refused caller its own
slot, and holding instead of refusing when the tenant and the caller's deadline allow.

What is asserted holds at any speed: the slots the desk books follow from the configured
rate, and where a wait depends on when a request reached the desk, the test bounds that
moment by its own clock (sent before, answered after) rather than assuming it was quick.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import NamedTuple

import msgspec
from nats.aio.client import Client

from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from tests.support.swarm import EXAMPLES, SWARM_NODES, Processes, start_swarm, wait_until_serving
from tests.support.waits import GENEROUS_S, listening, router_status, routers_ready

ROUTERS = ("router-1", "router-2")
# acme: one request every 5 s, 3 at once. A burst that reaches the desk within one
# interval (5 s, where it takes milliseconds) gets exactly 3 admitted.
ACME_PER_MIN, ACME_BURST = 12, 3
ACME_INTERVAL_S = 60 / ACME_PER_MIN
# patient: one every 0.5 s, 2 at once, held rather than refused when the caller can wait.
PATIENT_PER_MIN, PATIENT_BURST = 120, 2
PATIENT_INTERVAL_S = 60 / PATIENT_PER_MIN
SLACK_S = 1e-6  # float rounding between the desk's arithmetic and ours


class Answer(NamedTuple):
    reply: InferReply
    headers: dict[str, str]
    received: float  # time.monotonic() when the answer came


async def ask(client: Client, request: InferRequest) -> Answer:
    msg = await client.request(
        subjects.infer("ncm-base"), msgspec.json.encode(request), timeout=GENEROUS_S
    )
    reply = msgspec.json.decode(msg.data, type=InferReply)
    return Answer(reply, dict(msg.headers or {}), time.monotonic())


def quotas(tmp_path: Path) -> Path:
    path = tmp_path / "quotas.json"
    path.write_text(
        json.dumps(
            {
                "tenants": {
                    "acme": {"requests_per_min": ACME_PER_MIN, "burst": ACME_BURST},
                    "patient": {
                        "requests_per_min": PATIENT_PER_MIN,
                        "burst": PATIENT_BURST,
                        "hold": True,
                    },
                    # The same preference at one request a minute: after the first, the
                    # next slot is a minute away, whatever the machine's speed.
                    "patient-slow": {"requests_per_min": 1, "burst": 1, "hold": True},
                }
            }
        )
    )
    return path


async def start(processes: Processes, client: Client, tmp_path: Path) -> None:
    processes.start("breaker", "breaker", "--id", "breaker", "--quotas", str(quotas(tmp_path)))
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=0)
    for router_id in ROUTERS:
        processes.start(
            router_id,
            "router",
            "--id",
            router_id,
            "--enforce-quotas",
            # A router serves a request the desk has not answered in time (availability
            # first): on a busy machine that would admit beyond the budget under test.
            "--quota-timeout-ms",
            str(GENEROUS_S * 1000),
        )
    await wait_until_serving(client, "ncm-base")  # tenant "default": no quota
    await routers_ready(client, *ROUTERS)
    await listening(client, "breaker", "breaker", "quota")


def router_of(reply: InferReply) -> str:
    """The replica that took a request: its id prefixes the request ids it gives."""
    return reply.request_id.rsplit("-", 1)[0]


async def test_one_budget_across_replicas_and_each_refused_caller_gets_its_own_slot(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    """Sixteen requests of one tenant at once, through two router replicas. Proves: the
    replicas share one budget (exactly the tenant's burst of 3 is admitted, though both
    took requests); every refused caller gets rate_limited with the 429 headers, a
    ticket of its own and a slot of its own: the k-th refused is booked k intervals
    after the first request reached the desk, so its wait is k intervals less how much
    later it got there (at most the time the whole burst took); and the first refused
    caller, back at its Retry-After with its ticket, is served, while a caller without
    a ticket at that moment is still refused (the slot was booked, not refilled)."""
    await start(processes, client, tmp_path)
    burst = 16  # both replicas take some: all on one has odds of 1 in 2**15
    sent = time.monotonic()
    answers = await asyncio.gather(
        *(
            ask(client, InferRequest(prompt=f"acme {i}", max_tokens=2, tenant="acme"))
            for i in range(burst)
        )
    )
    took = max(a.received for a in answers) - sent
    # The desk judged each request between `sent` and the last answer. Within one
    # interval, no token comes back meanwhile: what follows is then exact.
    assert took < ACME_INTERVAL_S, f"the burst took {took:.2f} s to be judged"
    assert {router_of(a.reply) for a in answers} == set(ROUTERS)
    admitted = [a for a in answers if a.reply.ok]
    refused = sorted(
        (a for a in answers if not a.reply.ok), key=lambda a: a.reply.retry_after_s or 0.0
    )
    assert len(admitted) == ACME_BURST, "two routers share one burst of 3, not 3 each"
    assert len(refused) == burst - ACME_BURST
    assert all(a.reply.error is not None for a in refused)
    assert {a.reply.error.code for a in refused if a.reply.error} == {"rate_limited"}
    tickets = [a.reply.quota_ticket for a in refused]
    assert None not in tickets
    assert len(set(tickets)) == len(tickets), "each refused caller has a ticket of its own"
    for k, a in enumerate(refused, 1):
        wait = a.reply.retry_after_s or 0.0
        booked = k * ACME_INTERVAL_S  # after the first request, at 12 requests/min
        assert booked - took - SLACK_S <= wait <= booked + SLACK_S, (k, wait, took)
        assert a.headers["Hecate-Error"] == "rate_limited"
        assert a.headers["Nats-Service-Error-Code"] == "429"
        assert int(a.headers["Retry-After"]) >= 1
        assert abs(int(a.headers["Retry-After-Ms"]) / 1000 - wait) < 0.01

    first = refused[0]
    # The caller does what Retry-After tells it: come back that long after the answer.
    # This is the moment under test, named by the desk, not a wait for something else.
    back_at = first.received + (first.reply.retry_after_s or 0.0)
    await asyncio.sleep(max(0.0, back_at - time.monotonic()))
    back = await ask(
        client,
        InferRequest(
            prompt="acme back", max_tokens=2, tenant="acme", quota_ticket=first.reply.quota_ticket
        ),
    )
    assert back.reply.ok, back.reply.error
    stranger = await ask(client, InferRequest(prompt="acme stranger", max_tokens=2, tenant="acme"))
    assert not stranger.reply.ok
    assert stranger.reply.error is not None
    assert stranger.reply.error.code == "rate_limited"


async def test_a_patient_tenant_is_held_until_its_slot_instead_of_refused(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    """Four requests at once of a tenant that prefers holding (2 at once, then one
    every 0.5 s), each caller willing to wait 5 s. Proves: all four are served, none
    refused, and holding keeps the limit: the k-th answer comes no sooner than k - 2
    intervals after the requests were sent (a bound the rate sets, not the machine).
    And a tenant that prefers holding is still refused, not held, when the caller's
    deadline does not cover its wait: with one request a minute, the second caller
    willing to wait a second, or not at all, is refused with the wait that was too long."""
    await start(processes, client, tmp_path)
    sent = time.monotonic()
    answers = await asyncio.gather(
        *(
            ask(
                client,
                InferRequest(
                    prompt=f"patient {i}", max_tokens=2, tenant="patient", max_wait_ms=5000
                ),
            )
            for i in range(4)
        )
    )
    assert all(a.reply.ok for a in answers), [a.reply.error for a in answers]
    after = sorted(a.received - sent for a in answers)
    for k, elapsed in enumerate(after, 1):
        earliest = max(0, k - PATIENT_BURST) * PATIENT_INTERVAL_S
        assert elapsed >= earliest - SLACK_S, (k, after)
    statuses = [await router_status(client, r) for r in ROUTERS]
    assert all(s is not None for s in statuses)
    assert sum(s["counters"].get("quota_refused", 0) for s in statuses if s) == 0

    slow = await ask(client, InferRequest(prompt="on time", tenant="patient-slow"))
    assert slow.reply.ok, slow.reply.error  # a full bucket admits the first
    for max_wait_ms in (1000, 0):
        refused = await ask(
            client,
            InferRequest(prompt="no patience", tenant="patient-slow", max_wait_ms=max_wait_ms),
        )
        assert refused.reply.ok is False
        assert refused.reply.error is not None
        assert refused.reply.error.code == "rate_limited"
        assert (refused.reply.retry_after_s or 0.0) * 1000 > max_wait_ms
