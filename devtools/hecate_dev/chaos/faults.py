"""The faults the chaos scenarios inject into a running swarm, and the scenario-specific
checks each makes while its fault lasts. Each is ``async (swarm, nc, record, timing)``:
it notes every fault and heal in ``record`` (and the nodes it hurts, and the outages of
parts off the request path), injects them, and returns once the last one is healed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.bus import telemetry
from hecate.client import HecateClient
from hecate.wire import subjects
from hecate.wire.messages import BreakerChanged, NodeFault, TelemetrySnapshot
from hecate_dev.chaos.harness import BREAKER_COOLDOWN_S, Swarm
from hecate_dev.chaos.load import Record


@dataclass(frozen=True)
class Timing:
    warm: float  # load before the fault
    fault: float  # how long a fault lasts before it is healed
    settle: float  # load after the last heal

    @classmethod
    def of(cls, short: bool) -> Timing:
        return cls(1.0, 1.5, 2.0) if short else cls(3.0, 4.0, 5.0)


Fault = Callable[[Swarm, Client, Record, Timing], Awaitable[None]]


async def _serving_route(nc: Client, model: str) -> list[str]:
    reply = await HecateClient(nc, timeout_s=5.0).infer(model, "which route?", max_tokens=1)
    assert reply.route is not None, reply.error
    return [s.node_id for s in reply.route.stages]


async def _busiest_middle(nc: Client, pipelines: list[tuple[str, ...]]) -> str | None:
    """The middle node, among the pipelines', that is working on requests right now
    (None if none is): killing one that is mid-request is what makes a kill bite.

    Every stage request, routed or chained, travels on its node's run subject, which a
    plain subscriber hears too; a generation sends its middle stage a step every few
    tens of milliseconds. So the victim is the middle node that received the most
    stage requests over the last 0.3 s, the latest one breaking ties: one whose
    generation is still running, not one whose last request (a heartbeat's load figure
    still shows it) ended a moment ago. A probe request would not do, since routers
    steer it away from the pipelines their own requests already occupy."""
    middles = {p[len(p) // 2] for p in pipelines}
    steps: dict[str, int] = dict.fromkeys(middles, 0)
    last: dict[str, float] = dict.fromkeys(middles, 0.0)

    async def on_stage(msg: Msg) -> None:
        node_id = msg.subject.split(".")[2]
        if node_id in steps:
            steps[node_id] += 1
            last[node_id] = time.monotonic()

    sub = await nc.subscribe(subjects.node_run("*"), cb=on_stage)
    await asyncio.sleep(0.3)
    await sub.unsubscribe()
    best = max(sorted(steps), key=lambda n: (steps[n], last[n]), default=None)
    return best if best is not None and steps[best] > 0 else None


async def busiest_middle_node(swarm: Swarm, nc: Client, record: Record) -> str:
    """The node a node fault hurts: the busiest middle node (the serving route's middle
    one if none is busy)."""
    victim = await _busiest_middle(nc, record.pipelines)
    if victim is None:
        route = await _serving_route(nc, swarm.topology.base.id)
        victim = route[len(route) // 2]
    return victim


async def node_kill(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    victim = await busiest_middle_node(swarm, nc, record)
    record.fault(f"SIGKILL node {victim}")
    record.impair(victim)
    await asyncio.to_thread(swarm.kill, f"node-{victim}")
    await asyncio.sleep(t.fault)
    record.fault(f"restart node {victim}")
    await asyncio.to_thread(swarm.restart, f"node-{victim}")


async def router_kill(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    del nc
    # Frozen first: the requests the queue group hands it meanwhile are certainly in
    # flight on it when it dies (a bare SIGKILL may find it idle between requests).
    record.fault("SIGSTOP router-1")
    await asyncio.to_thread(swarm.kill, "router-1", signal.SIGSTOP, wait=False)
    await asyncio.sleep(0.3)
    record.fault("SIGKILL router-1")
    await asyncio.to_thread(swarm.kill, "router-1")
    await asyncio.sleep(t.fault)
    record.fault("restart router-1")
    await asyncio.to_thread(swarm.restart, "router-1")


async def control_plane(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    del nc
    for label in ("planner", "telemetry", "breaker"):
        record.fault(f"SIGKILL {label}")
        down = time.monotonic()
        await asyncio.to_thread(swarm.kill, label)
        await asyncio.sleep(t.fault)
        record.outages.append((down, time.monotonic()))
        record.fault(f"restart {label}")
        await asyncio.to_thread(swarm.restart, label)
        await asyncio.sleep(t.fault / 2)


async def nats_restart(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    before = await kv.get(subjects.PLAN_KEY)
    # Every node is cut off until it has reconnected and subscribed again: no pipeline is
    # intact meanwhile, so a reserve answer then is the right one, not a needless one.
    for node in await asyncio.to_thread(nodes_connected_to, swarm.servers[0].monitor_port):
        record.impair(node)
    record.fault("SIGKILL nats-server")
    await asyncio.to_thread(swarm.kill_server)
    await asyncio.sleep(min(1.0, t.fault))
    record.fault("restart nats-server (same port, same store)")
    await asyncio.to_thread(swarm.start_server)
    for _ in range(100):  # the load's own connection reconnects too
        try:
            after = await kv.get(subjects.PLAN_KEY)
            break
        except Exception:
            await asyncio.sleep(0.1)
    else:
        after = None
    record.checks["plan_survived"] = after is not None and after.value == before.value


async def cluster_member_kill(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    """Three routed nats-servers with every KV bucket replicated 3 times; SIGKILL the one
    the callers are connected to (so that their requests in flight are certainly cut
    off) under load: the processes connected to it reconnect to the others. Then
    restart it."""
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    before = await kv.get(subjects.PLAN_KEY)
    # The server itself says which one holds the callers' connection (by its name);
    # the port the client believes it is on only when no server does.
    monitors = [s.monitor_port for s in swarm.servers]
    holding = await asyncio.to_thread(_holding, monitors, nc.options.get("name") or "")
    ours = nc.connected_url.port if nc.connected_url else None
    guess = next((i for i, s in enumerate(swarm.servers) if s.client_port == ours), None)
    index = holding if holding is not None else guess if guess is not None else 0
    # Whether the client's own idea of its server was right (1) or not (0).
    record.notes["client_knew_its_server"] = float(guess == index)
    # A node whose connection is on the killed server is cut off until it reconnects:
    # for that while, its pipelines are not intact, and a reserve answer is right.
    for node in await asyncio.to_thread(nodes_connected_to, swarm.servers[index].monitor_port):
        record.impair(node)
    record.fault(f"SIGKILL nats-server {index} of 3 (the callers')")
    await asyncio.to_thread(swarm.kill_server, index)
    await asyncio.sleep(t.fault)
    after = None
    for _ in range(100):  # from the surviving two (our own connection may be moving)
        try:
            after = await kv.get(subjects.PLAN_KEY)
            break
        except Exception:
            await asyncio.sleep(0.1)
    record.checks["plan_readable_with_a_server_down"] = (
        after is not None and after.value == before.value
    )
    record.fault(f"restart nats-server {index}")
    await asyncio.to_thread(swarm.start_server, index)


def _holding(monitor_ports: list[int], name: str) -> int | None:
    """Which server (by index) has a connection named ``name``."""
    for i, port in enumerate(monitor_ports):
        if name in _connection_names(port):
            return i
    return None


def _connection_names(monitor_port: int) -> list[str]:
    url = f"http://127.0.0.1:{monitor_port}/connz?limit=4096"
    with urllib.request.urlopen(url, timeout=5) as answer:
        connz = json.load(answer)
    return [str(c.get("name", "")) for c in connz.get("connections", [])]


def nodes_connected_to(monitor_port: int) -> set[str]:
    """The node ids with a connection on the server whose monitoring port this is, read
    from its ``/connz`` (a node's connections are named ``<service>-<node id>-in|out``)."""
    return {
        node
        for name in _connection_names(monitor_port)
        if (node := node_of_connection(name)) is not None
    }


def node_of_connection(name: str) -> str | None:
    prefix = f"{subjects.SERVICE_NAMES['node']}-"
    for suffix in ("-in", "-out"):
        if name.startswith(prefix) and name.endswith(suffix):
            return name[len(prefix) : -len(suffix)] or None
    return None


async def _fault(nc: Client, node: str, fault: NodeFault) -> None:
    await nc.request(subjects.node_fault(node), msgspec.json.encode(fault), timeout=5)


async def _telemetry(nc: Client) -> TelemetrySnapshot | None:
    """Telemetry's snapshot in KV now (None: not written yet, or not readable now)."""
    try:
        return await telemetry.read(await kvs.bucket(nc, subjects.TELEMETRY_BUCKET))
    except Exception:  # not written yet, or the bus is busy: no reading this time
        return None


def _latency(snapshot: TelemetrySnapshot | None, node: str) -> float | None:
    state = snapshot.nodes.get(node) if snapshot is not None else None
    return state.latency_ms if state is not None else None


async def sick_node(swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
    """The middle node of the serving pipeline stays up but each of its stages takes ten
    times its declared latency, then fails with an error, then heals. Telemetry must see
    the slowness as it would a slow machine's; load must move off the node while slow;
    its circuit must open while it fails and close again once it is healthy."""
    route = await _serving_route(nc, swarm.topology.base.id)
    victim = route[len(route) // 2]
    declared = next(n.latency_ms for n in swarm.topology.nodes if n.id == victim)
    delay_ms = 10 * max(declared, 1.0)
    changes: list[tuple[float, str]] = []

    async def on_breaker(msg: Msg) -> None:
        change = msgspec.json.decode(msg.data, type=BreakerChanged)
        if change.target == victim:
            changes.append((time.monotonic(), change.state))

    sub = await nc.subscribe(subjects.EVENT_BREAKER, cb=on_breaker)
    loop = asyncio.get_running_loop()
    began = loop.time() - t.warm
    snapshot = await _telemetry(nc)
    seen_before = _latency(snapshot, victim)
    # Load can only move to a replica the routers know to be faster: one that has never
    # run a stage carries the cost model's cold penalty (250 ms a node), more than this
    # slowness costs. Noted, so that a failed check below can be read.
    replicas = [n for p in record.pipelines if victim not in p for n in p]
    record.notes["replica_measured_before_slow"] = float(
        bool(replicas) and all(_latency(snapshot, n) is not None for n in replicas)
    )
    record.fault(f"node {victim} {delay_ms:g} ms per stage (10x its declared latency)")
    record.impair(victim)
    slow_at = loop.time()
    await _fault(nc, victim, NodeFault(delay_ms=delay_ms))
    peak: float | None = None
    while loop.time() < slow_at + t.fault:  # what telemetry publishes while it is slow
        await asyncio.sleep(0.1)
        seen = _latency(await _telemetry(nc), victim)
        if seen is not None:
            peak = seen if peak is None else max(peak, seen)
    # The node times its stage with the delay inside, as a slow machine's would be, so
    # the slowness reaches telemetry with the next heartbeats. Half the delay, not all
    # of it: two EWMAs stand between (the node's per stage, telemetry's per heartbeat),
    # and the node may serve only a few slow stages before load moves off it.
    rise = (peak or 0.0) - (seen_before or 0.0)
    record.notes["injected_delay_ms"] = delay_ms
    record.notes["telemetry_latency_ms_before"] = round(seen_before or 0.0, 3)
    record.notes["telemetry_latency_ms_while_slow"] = round(peak or 0.0, 3)
    record.checks["telemetry_saw_the_node_slow"] = peak is not None and rise >= delay_ms / 2
    before = record.share_via(victim, began, slow_at)
    # Judge the second half: the routers move load off at once for the requests of
    # their own that pile up on the node (their cost counts them), and through
    # telemetry's latency for it only once a few heartbeats have carried the slowness.
    during = record.share_via(victim, slow_at + t.fault / 2, loop.time())
    record.notes["share_via_node_before"] = round(before, 3)
    record.notes["share_via_node_while_slow"] = round(during, 3)
    record.checks["load_moved_off_slow_node"] = during < before / 2
    record.fault(f"node {victim} answers every stage with an error")
    await _fault(nc, victim, NodeFault(error="internal"))
    await asyncio.sleep(t.fault)
    record.fault(f"node {victim} healed")
    healed = time.monotonic()
    await _fault(nc, victim, NodeFault())
    for _ in range(int((BREAKER_COOLDOWN_S + 15) / 0.1)):  # cooldown, then one probe
        if any(at > healed and state == "closed" for at, state in changes):
            break
        await asyncio.sleep(0.1)
    await sub.unsubscribe()
    record.checks["breaker_opened"] = any(state == "open" for _, state in changes)
    record.checks["breaker_closed_after_heal"] = any(
        at > healed and state == "closed" for at, state in changes
    )
    closed = [at for at, state in changes if at > healed and state == "closed"]
    if closed:
        record.notes["breaker_closed_s_after_heal"] = round(closed[0] - healed, 2)
