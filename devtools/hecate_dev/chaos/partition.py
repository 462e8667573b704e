"""server-partition: one nats-server of three is cut off from its peers and from every
client, alive and silent, as behind a failed switch port; the clients and services on
it must move to the other two, and the plan must stay readable and writable there.

The cluster is fronted (``Setup(proxied=("nats-*",))``): each server's clients reach it
through a proxy of its own, and each route between two servers goes through a proxy per
(from, to) pair, so that the server the callers are on can be cut alone. The cut holds
the bytes (a half-open link: nothing is closed, nothing arrives), on its routes and on
its client links, both ways, as a real partition does.

What notices a held link is a ping that goes unanswered: a service's connection pings
every 5 s and gives up after 3 unanswered (15-20 s), the callers' (nats-py's defaults)
every 2 minutes and after 2 (4 minutes), and the servers' routes every 2 minutes too.
A run cannot wait that long, and what the swarm does once a client has noticed does
not depend on how late it noticed; so after :data:`DETECT_S` of held links the
server's client links are reset, standing for those pings, while the server stays cut
(a client that dials it again is held until its connect timeout, and moves on). Dropping
the bytes instead would lose a SUB sent meanwhile and cut NATS frames in half, which no
partition does; a reset at once would be a server that died, which nats-cluster tests.

The routes stay held for the whole window: the two others, hearing no JetStream
heartbeat from it, elect new leaders among themselves for whatever it led (the
streams have three replicas, so two are a quorum); it, alone, can elect nothing. A
client on the majority side then reads the plan and writes to the plan's bucket (a
probe key beside the plan, which every service watches by its own key only), as the
planner would. On the heal the held bytes go out; the cut server catches up.

No explicit error is allowed. A router that was on the cut server with a caller's
request hears nothing at all while its link is held: each stage it sent times out, but
that is its own isolation, not the nodes' (``hecate_router.hearing``), so it blames
nobody, spends no attempt, and sends the stage again once its link has moved; the
caller, moved too, gets the answer. A node on the cut server has both its connections
there (``hecate.bus.connection.one_order``), so telemetry, hearing none of its beats,
calls it down; a request in flight whose every route (the reserve's too) went silent
that way waits for one to come back (``hecate_router.lifecycle``, ``WAITING``), and the
nodes' links, reset and moved, bring it back.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.wire import subjects
from hecate_dev.chaos.acceptance import Expect
from hecate_dev.chaos.faults import Timing, _holding, nodes_connected_to
from hecate_dev.chaos.harness import Swarm
from hecate_dev.chaos.load import Record
from hecate_dev.chaos.proxy import FaultProxy
from hecate_dev.chaos.results import ScenarioResult
from hecate_dev.chaos.scenario import Scenario, num, retries, seconds
from hecate_dev.chaos.setup import Setup

# Held links before the cut server's clients are reset, standing for their pings.
DETECT_S = 3.0
PROBE_KEY = "chaos-partition-probe"
T = TypeVar("T")
_ATTEMPT_S = 2.0  # one read or write of the probe before it is tried again


async def _quiet(_exc: Exception) -> None:
    """The probe's connection may meet the cut server while it dials; that is the fault."""


def _cut_links(swarm: Swarm, index: int) -> list[FaultProxy]:
    """Every proxy a partition of server ``index`` silences: its clients' and its
    routes', both ways."""
    routes = [p for (i, j), p in swarm.route_proxies.items() if index in (i, j)]
    return [swarm.proxy(f"nats-{index}"), *routes]


async def _until(deadline: float, attempt: Callable[[], Awaitable[T]]) -> tuple[T, float] | None:
    """``attempt``'s result and when it came (monotonic), tried again until it comes
    before ``deadline``; None if it never did."""
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(_ATTEMPT_S):
                return await attempt(), time.monotonic()
        except Exception:  # no leader yet (the two are electing one): try again
            await asyncio.sleep(0.1)
    return None


async def _plan_from_majority(
    swarm: Swarm, index: int, cut: float, deadline: float
) -> tuple[bytes | None, float | None]:
    """From a client of the two other servers, before ``deadline``: the plan as read
    there, and how long after ``cut`` a write to the plan's bucket came back."""
    urls = [u for i, u in enumerate(swarm.server_urls) if i != index]
    probe = await nats.connect(
        urls,
        name="hecate-chaos-partition-probe",
        connect_timeout=_ATTEMPT_S,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,
        error_cb=_quiet,
    )
    stamp = f"{time.time():.6f}".encode()

    async def read() -> bytes | None:
        kv = await kvs.bucket(probe, subjects.PLAN_BUCKET)
        return (await kv.get(subjects.PLAN_KEY)).value

    async def write() -> bool:
        kv = await kvs.bucket(probe, subjects.PLAN_BUCKET)
        await kv.put(PROBE_KEY, stamp)
        if (await kv.get(PROBE_KEY)).value != stamp:
            raise ValueError("the probe read back is not the one written")
        return True

    try:
        plan = await _until(deadline, read)
        wrote = await _until(deadline, write)
        return (
            plan[0] if plan is not None else None,
            wrote[1] - cut if wrote is not None else None,
        )
    finally:
        await probe.close()


async def _router_counters(swarm: Swarm, nc: Client) -> dict[str, int]:
    """Every router's counters, summed (a router that does not answer adds nothing)."""
    total: dict[str, int] = {}
    name = subjects.SERVICE_NAMES["router"]
    for i in range(1, swarm.routers + 1):
        try:
            msg = await nc.request(f"$SRV.STATS.{name}.router-{i}", b"", timeout=2)
        except Exception:  # gone or busy: its figures are missing from the sum
            continue
        for endpoint in json.loads(msg.data).get("endpoints", []):
            for key, n in ((endpoint.get("data") or {}).get("counters") or {}).items():
                total[key] = total.get(key, 0) + int(n)
    return total


async def server_partition(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    """Cut the callers' server from its peers and clients for ``t.fault`` seconds (its
    client links reset after :data:`DETECT_S`), check the plan from the other two, heal."""
    monitors = [s.monitor_port for s in swarm.servers]
    holding = await asyncio.to_thread(_holding, monitors, nc.options.get("name") or "")
    index = holding if holding is not None else 0
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    before = (await kv.get(subjects.PLAN_KEY)).value
    # Whether the plan's stream was led from the cut server (a write then waits for
    # the two others to elect a leader) or not (it goes on at once).
    info = await nc.jetstream().stream_info(f"KV_{subjects.PLAN_BUCKET}")
    leader = info.cluster.leader if info.cluster is not None else None
    record.notes["plan_leader_cut"] = float(leader == f"hecate-{index}")
    # A node whose connections are on the cut server hears nothing until they move:
    # for that while its pipelines are not intact, and a reserve answer is right.
    for node in await asyncio.to_thread(nodes_connected_to, swarm.servers[index].monitor_port):
        record.impair(node)
    links = _cut_links(swarm, index)
    record.fault(f"partition nats-server {index} of 3 (the callers'): links held")
    cut = time.monotonic()
    for proxy in links:
        await proxy.blackhole()
    heal_at = cut + t.fault
    checking = asyncio.create_task(_plan_from_majority(swarm, index, cut, heal_at))
    await asyncio.sleep(min(DETECT_S, t.fault / 2))
    record.fault(f"clients of nats-server {index} notice: their links reset")
    record.notes["client_links_reset"] = await swarm.proxy(f"nats-{index}").reset()
    plan, wrote_in = await checking
    await asyncio.sleep(max(0.0, heal_at - time.monotonic()))
    cut_port = swarm.proxy(f"nats-{index}").port
    url = nc.connected_url
    moved = nc.is_connected and url is not None and url.port != cut_port
    record.fault(f"heal nats-server {index}")
    for proxy in links:
        await proxy.heal()
    # The planner may have replanned round the cut nodes meanwhile: any plan it wrote.
    record.checks["plan_readable_from_majority"] = bool(plan)
    record.notes["plan_as_before"] = float(plan == before)
    record.checks["plan_writable_from_majority"] = wrote_in is not None
    record.checks["callers_moved_to_majority"] = moved
    # What the routers did with the stages their own held link lost: resent them,
    # blaming nobody (a failover event would have named a node that never failed).
    counters = await _router_counters(swarm, nc)
    record.notes["router_resent_isolated"] = float(counters.get("resent_isolated", 0))
    # And the requests whose every route went silent with the cut server's nodes: held
    # for a route, and how many had one come back (the rest waited out: unrecoverable).
    for name in ("held_for_route", "route_came_back", "waited_out"):
        record.notes[f"router_{name}"] = float(counters.get(name, 0))
    if wrote_in is not None:
        record.notes["plan_write_s"] = round(wrote_in, 2)


class ServerPartition(Scenario):
    """One server of a cluster of three cut off from its peers and its clients."""

    name = "server-partition"
    expect = Expect(
        ("recover_s",),
        "the cut server is the callers' own: a request they sent on it is held with "
        "their link, and cannot be answered before their connection has moved",
        allowed_send_failures={
            "client_timeout": "a send the caller made on the cut server is held there "
            "with its link, and nothing can answer it: its caller's own timeout ends it, "
            "and the caller sends again once its connection has moved"
        },
    )
    setup = Setup(cluster=3, proxied=("nats-*",))
    # Long enough in both for the two others to elect new JetStream leaders (a few
    # seconds without heartbeats) well inside the window.
    timings = (Timing(1.0, 8.0, 4.0), Timing(3.0, 15.0, 8.0))

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        await server_partition(swarm, nc, record, t)

    def meaning(self, r: ScenarioResult) -> str:
        wrote = r.notes.get("plan_write_s")
        led = (
            "the plan's stream was led from the cut server, so the two elected a leader first"
            if r.notes.get("plan_leader_cut")
            else "the plan's stream was led from one of the two"
        )
        plan = (
            f"a write to the plan's bucket from the other two came back "
            f"{num(wrote, 2)} s after the cut ({led})"
            if wrote is not None
            else f"the plan's bucket was **not** writable from the other two ({led})"
        )
        resent = int(r.notes.get("router_resent_isolated", 0))
        held = (
            f"; the routers resent {resent} stage{'' if resent == 1 else 's'} their own "
            "held link had lost, blaming no node"
            if resent
            else ""
        )
        waited = int(r.notes.get("router_held_for_route", 0))
        came = int(r.notes.get("router_route_came_back", 0))
        if waited:
            held += (
                f"; {waited} request{'' if waited == 1 else 's'} in flight lost every "
                f"route with the cut nodes and waited for one: {came} came back"
            )
        return (
            "the callers' server is cut from its peers and clients with its links held; "
            f"after {num(DETECT_S, 1)} s (standing for their pings) its clients' links "
            "are reset and they move to the other two, which keep a JetStream quorum: "
            f"{plan}. Callers retried {retries(r)}, max {seconds(r.max_ms)}, recovered "
            f"in {num(r.recover_s, 2)} s{held}."
        )
