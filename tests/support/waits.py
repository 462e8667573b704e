"""Waiting for what a test needs, never for a length of time.

The suite runs on a loaded two-core machine: a fixed sleep is too short there and wasted
everywhere else. Each helper polls the condition itself, within a deadline generous
enough that only a broken swarm reaches it (a bound, not a figure anyone asserts).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.core import SwarmPlan
from hecate.wire import subjects

GENEROUS_S = 30.0


async def until(
    predicate: Callable[[], bool | Awaitable[bool]],
    what: str,
    timeout: float = GENEROUS_S,
    poll_s: float = 0.02,
    last: object = None,
) -> None:
    """Until ``predicate()`` (plain or async) holds; an AssertionError naming ``what``
    (and ``last``, what the predicate last saw, if it keeps one) if it still does not
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}" + (
            "" if last is None else f" (last: {last})"
        )
        await asyncio.sleep(poll_s)


async def stats(client: Client, service: str, instance: str) -> dict[str, Any] | None:
    """One instance's ``$SRV.STATS`` document; None while it does not answer."""
    name = subjects.SERVICE_NAMES[service]
    try:
        msg = await client.request(f"$SRV.STATS.{name}.{instance}", b"", timeout=2)
    except Exception:  # not started yet (no responders) or too busy to answer in time
        return None
    doc: dict[str, Any] = json.loads(msg.data)
    return doc


def endpoint_data(doc: dict[str, Any] | None, endpoint: str) -> dict[str, Any] | None:
    """The ``data`` of ``endpoint`` in a STATS document; None while it is not listed."""
    if doc is None:
        return None
    for e in doc["endpoints"]:
        if e["name"] == endpoint:
            data: dict[str, Any] = e["data"]
            return data
    return None


async def listening(client: Client, service: str, instance: str, endpoint: str) -> None:
    """Until the instance lists ``endpoint``. A service lists an endpoint once it has
    subscribed, and answers $SRV on that same connection, so whatever is sent from here
    on is heard (core NATS keeps nothing for a subscriber that is not there yet)."""

    async def listed() -> bool:
        return endpoint_data(await stats(client, service, instance), endpoint) is not None

    await until(listed, f"{service} {instance} listening on {endpoint}")


async def router_status(client: Client, router_id: str) -> dict[str, Any] | None:
    """A router's status (freshness, in flight, counters); None while it does not answer."""
    return endpoint_data(await stats(client, "router", router_id), "infer")


async def routers_ready(client: Client, *router_ids: str) -> None:
    """Until every named router holds a plan and fresh telemetry. A swarm that serves
    says only that one replica does: another one still starting rejects with no_plan."""
    for router_id in router_ids:

        async def ready(router_id: str = router_id) -> bool:
            status = await router_status(client, router_id)
            return (
                status is not None
                and status["snapshot"] == "fresh"
                and int(status["plan_epoch"]) >= 1
            )

        await until(ready, f"router {router_id} holding a plan and fresh telemetry")


async def router_infer_stats(client: Client, routers: int, within: float) -> list[dict[str, Any]]:
    """The infer statistics of the routers that answer within ``within`` s (it returns
    as soon as ``routers`` have)."""
    inbox = client.new_inbox()
    sub = await client.subscribe(inbox)
    await client.publish("$SRV.STATS.hecate-router", b"", reply=inbox)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + within
    while len(out) < routers and time.monotonic() < deadline:
        try:
            msg = await sub.next_msg(timeout=max(0.01, deadline - time.monotonic()))
        except Exception:
            break
        doc = json.loads(msg.data)
        # A replica answers $SRV from its start, but lists infer only once it has a
        # plan and joins the queue group: until then it is not up, whatever it says.
        data = next((e["data"] for e in doc["endpoints"] if e["name"] == "infer"), None)
        if data is not None:
            out.append(data)
    await sub.unsubscribe()
    return out


async def routers_up(client: Client, routers: int) -> None:
    """Until every replica answers: serving says only that one of them does, and a
    replica still starting on a busy machine would be missing from a sum below."""
    deadline = time.monotonic() + 30.0
    while len(up := await router_infer_stats(client, routers, 1.0)) < routers:
        assert time.monotonic() < deadline, f"{len(up)} of {routers} routers started"


async def planned(client: Client, model: str, pipelines: int, routers: int) -> None:
    """Until the plan holds ``pipelines`` pipelines of ``model`` and ``routers`` router
    replicas route on it. Serving says only that one route does: nodes join the planner
    one by one, so on a loaded machine the first plan may hold one pipeline, and a test
    that kills its node then meets no replica where the whole swarm has one."""
    bucket = await asyncio.wait_for(kvs.wait_bucket(client, subjects.PLAN_BUCKET), GENEROUS_S)
    epoch = 0

    async def whole() -> bool:
        nonlocal epoch
        try:
            entry = await bucket.get(subjects.PLAN_KEY)
        except Exception:  # no plan yet
            return False
        plan = msgspec.json.decode(entry.value or b"", type=SwarmPlan)
        # The KV revision is the epoch routers adopt (and report); the body's own epoch
        # is the planner's count of changes, ahead of it when joins came in one batch.
        epoch = int(entry.revision or 0)
        return len(plan.pipelines_of(model)) >= pipelines

    await until(whole, f"a plan with {pipelines} pipelines of {model}")

    async def followed() -> bool:
        every = await router_infer_stats(client, routers, 1.0)
        return len(every) == routers and all(int(s["plan_epoch"]) >= epoch for s in every)

    await until(followed, f"{routers} routers on plan epoch {epoch}")
