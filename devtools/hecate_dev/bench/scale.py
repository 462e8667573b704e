"""``hecate bench scale``: what a swarm of many nodes costs, size by size.

At each size, a nats-server, one telemetry service, one router, a planner and node
hosts (``hecate
node-host``: many node identities in one process, each a whole node on the bus) on the
toy executor, beating at ``heartbeat_ms``. Measured, per size: how long until telemetry
calls every node alive (``all_alive_s``, from the hosts' start); how long after that the
planner, running from the start as a swarm's does, has published a plan holding them
all (``planned_s``; ``--pipelines auto``, a 48-layer base on nodes of 8);
each host's memory (RSS) and what one identity adds; the CPU the hosts and telemetry
spend per second once the swarm stands, per node; the telemetry snapshot every router follows: its
bytes, whole, and per node; and what following it costs a router: the updates and
bytes a second it receives, and the CPU a second of a router with nothing to route. A
size whose nodes are not all alive within ``form_timeout_s`` is recorded with how many
were, and the suite goes on.

Nodes pace their heartbeats to the swarm (``--heartbeat-budget-per-s`` 2,000 beats a
second in all, never slower than ``MOST_MS``): every ``heartbeat_ms`` up to 2,000
nodes, slower past it. Also per size, the plan: its bytes, and the shares the planner
wrote (each node reads its own, never the plan). And, in this process, what a routing
decision costs a router holding a plan of that size (six-stage copies, every node
measured): idle with nothing measured, with half the copies' round trips measured,
and with 32 requests in flight too; and what a new telemetry snapshot costs it (the
state rebuilt, and the first decision on it).

Not yet here: routing at these sizes under load, several routers, and the cut-off
namespace (the rest of the scale suite).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus import telemetry
from hecate.bus.server import NatsServer
from hecate.bus.telemetry import Following
from hecate.core import (
    ModelSpec,
    NodeProfile,
    NodeState,
    Pipeline,
    Route,
    Router,
    RoutingRequest,
    Stage,
    SwarmPlan,
    SwarmState,
)
from hecate.core.cost import inflight_cost
from hecate.core.telemetry import BEAT_BUDGET_PER_S, beat_interval
from hecate.wire import subjects
from hecate.wire.messages import TelemetrySnapshot
from hecate_dev.bench.bus_setup import cpu_seconds
from hecate_dev.bench.core import per_call_us
from hecate_dev.bench.cutoff import RACK, cut_off
from hecate_dev.hosts import unavailable
from hecate_launcher import ProcessSpec, Supervisor

T = TypeVar("T")
SIZES = (100, 500, 1000, 2000, 5000)
QUICK_SIZES = (50, 200)
ROUTER_LEVELS = ((1000, 10),)  # (nodes, routers): the same swarm followed by many routers
QUICK_ROUTER_LEVELS = ((200, 3),)
# (nodes, telemetry replicas): the heartbeat intake shared by several replicas
SHARD_LEVELS = ((1000, 4), (5000, 4))
QUICK_SHARD_LEVELS = ((200, 2),)
CUTOFF_RACKS = 10  # racks of 100 nodes, on hosts apart, for the cut-off
MOST_MS = 10_000  # the slowest a node of the largest swarm here beats
DECISION_STAGES = 6
# One base of 48 layers, every node holding 8: as many copies as the nodes can form.
TOPOLOGY = {"models": [{"id": "scale", "layers": 48}], "nodes": [{"id": "x", "capacity_layers": 8}]}
# Two models: the base, and an expert of 24 layers in 40 copies (120 nodes of 8 layers);
# the base takes every further copy the rest can form.
EXPERT = {"id": "scale-expert", "layers": 24, "role": "expert", "replicas": 40}
TWO_MODELS = {**TOPOLOGY, "models": [*TOPOLOGY["models"], EXPERT]}
PLAN_ARGS = ("--pipelines", "auto", "--settle-ms", "500")
IN_STEP_S = 15.0  # the longest a follower starting may take to be in step (see _follow)
PER_HOST = 1000  # identities in one host process: about one core's worth at 1 s beats
# Identities started a second, all hosts together: at 1,800 a second (200 a host) two
# cores could not open the connections within the 10 s a node allows itself.
STARTS_PER_S = 400
STEADY_S = 10.0  # how long the standing swarm's CPU is measured
QUICK_STEADY_S = 3.0


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process, MB (Linux ``/proc``)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def _poll(
    url: str,
    read: Callable[[Client], Awaitable[tuple[T | None, int]]],
    done: Callable[[T], bool],
    timeout_s: float,
) -> tuple[T | None, int, float]:
    """``read`` until ``done`` holds of what it read: the last value read (None: never
    written), its bytes, and the seconds waited."""
    started = time.monotonic()
    nc = await nats.connect(url)
    last: T | None = None
    size = 0
    try:
        while time.monotonic() - started < timeout_s:
            try:
                value, got = await read(nc)
            except Exception:  # the bucket or the key not written yet
                value = None
            if value is not None:
                last, size = value, got
                if done(last):
                    break
            await asyncio.sleep(0.25)
    finally:
        await nc.close()
    return last, size, time.monotonic() - started


async def _heard(url: str, replicas: list[str]) -> dict[str, tuple[int, int]]:
    """Heartbeats each telemetry replica has taken so far, and those it has missed
    (gaps in the nodes' numbering): its heartbeat endpoints' message counts and its
    ``beats_missed``, from ``$SRV.STATS`` ((-1, -1) for one that did not answer)."""
    name = subjects.SERVICE_NAMES["telemetry"]
    nc = await nats.connect(url)
    out: dict[str, tuple[int, int]] = {}
    try:
        for label in replicas:
            try:
                msg = await nc.request(f"$SRV.STATS.{name}.{label}", b"", timeout=5)
            except Exception:
                out[label] = (-1, -1)
                continue
            beats = [
                e for e in json.loads(msg.data)["endpoints"] if e["name"].startswith("heartbeat")
            ]
            missed = next(e["data"]["beats_missed"] for e in beats if e["name"] == "heartbeat")
            out[label] = (sum(e["num_requests"] for e in beats), missed)
    finally:
        await nc.close()
    return out


async def _read_plan(nc: Client) -> tuple[SwarmPlan | None, int]:
    value, _revision = await kvs.get(await kvs.bucket(nc, subjects.PLAN_BUCKET), subjects.PLAN_KEY)
    return (msgspec.json.decode(value, type=SwarmPlan), len(value)) if value else (None, 0)


async def _read_telemetry(nc: Client) -> tuple[TelemetrySnapshot | None, int]:
    """Every shard's snapshot merged, and the bytes of the shards' values."""
    # The snapshots in KV, and the deltas of the next 0.3 s after them: every node's
    # liveness as telemetry has it now, not as of its latest snapshot.
    kv = await kvs.bucket(nc, subjects.TELEMETRY_BUCKET)
    snap = await telemetry.read(kv, nc=nc, listen_s=0.3)
    return snap, len(msgspec.json.encode(snap)) if snap is not None else 0


def _alive_count(snap: TelemetrySnapshot | None) -> int:
    return 0 if snap is None else sum(t.alive for t in snap.nodes.values())


def _copies(plan: SwarmPlan | None) -> dict[str, int]:
    """Copies planned of each model."""
    out: dict[str, int] = {}
    for p in plan.pipelines if plan is not None else ():
        out[p.model_id] = out.get(p.model_id, 0) + 1
    return out


def _planned_count(plan: SwarmPlan | None) -> int:
    return 0 if plan is None else len(plan.nodes)


def _failure(procs: Supervisor, label: str) -> str | None:
    """Why host ``label`` exited, from the first loop failure it logged; None while it
    runs."""
    if procs.alive(label):
        return None
    for line in procs.log(label).splitlines():
        if '"background loop failed"' in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            detail = str(record.get("exception", "")).strip().splitlines()
            return f"{record.get('loop')}: {detail[-1] if detail else record.get('error')}"
    return "exited"


async def _follow(url: str, seconds: float) -> Following:
    """What following telemetry costs a router in step over ``seconds``: the deltas and
    their bytes, and the snapshots it read again and theirs (the router's own
    :func:`hecate.bus.telemetry.follow`). Counted once it is in step: a follower
    starting reads every shard's snapshot, and misses the deltas published between a
    snapshot and its subscription, so it reads each shard's next one too (a shard puts
    one every second or more: up to ``IN_STEP_S``)."""
    nc = await nats.connect(url)
    shards = telemetry.Shards()
    start, started_at = Following(), math.inf
    try:
        kv = await kvs.bucket(nc, subjects.TELEMETRY_BUCKET)
        steps = telemetry.follow(nc, kv, lambda _r, _e: None, shards=shards)
        with contextlib.suppress(TimeoutError):  # one timeout: a cancelled follow is over
            async with asyncio.timeout(IN_STEP_S + seconds):
                async for _step in steps:
                    now = time.monotonic()
                    if started_at == math.inf and _in_step(shards):
                        start, started_at = dataclasses.replace(shards.stats), now
                    if now - started_at >= seconds:
                        break
        await steps.aclose()
    finally:
        await nc.close()
    end = shards.stats
    return Following(
        **{f.name: getattr(end, f.name) - getattr(start, f.name) for f in dataclasses.fields(end)}
    )


def _in_step(shards: telemetry.Shards) -> bool:
    """Every shard held, a delta applied on its snapshot, and none missed since."""
    held = shards.held.values()
    return bool(held) and all(h.missed is None and h.applied > 0 for h in held)


def _state(pipelines: int, stages: int, *, seed: int = 7) -> SwarmState:
    """``pipelines`` disjoint copies of a ``stages``-stage model, every node measured
    (built in one go: a snapshot's worth, as a router adopts it)."""
    rng = random.Random(seed)
    nodes = []
    pipes = []
    for p in range(pipelines):
        chain = []
        for s in range(stages):
            node_id = f"n{p}-{s}"
            nodes.append(NodeProfile(node_id=node_id, capacity_layers=8))
            chain.append(Stage(node_id=node_id, layer_start=s * 8, layer_end=s * 8 + 8))
        pipes.append(Pipeline(pipeline_id=f"scale-r{p}", model_id="scale", stages=tuple(chain)))
    plan = SwarmPlan(
        epoch=1,
        models=(ModelSpec(model_id="scale", layers=stages * 8),),
        nodes=tuple(nodes),
        pipelines=tuple(pipes),
    )
    measured = {
        n.node_id: NodeState(
            latency_ms=rng.uniform(1, 20), load=rng.uniform(0, 1), score=rng.uniform(0.5, 4)
        )
        for n in nodes
    }
    return SwarmState(plan, measured)


def decisions(size: int, *, samples: int = 300) -> dict[str, Any]:
    """What a routing decision and a snapshot cost a router holding ``size`` nodes."""
    rng = random.Random(3)
    request = RoutingRequest(tokens=512)
    state = _state(max(1, size // DECISION_STAGES), DECISION_STAGES)
    router = Router(state)
    idle = per_call_us(lambda: router.route("scale", request, now=1.5), samples)
    for p in state.plan.pipelines[::2]:
        router.measured(p.pipeline_id, rng.uniform(0.01, 0.1), 1.0)
    measured = per_call_us(lambda: router.route("scale", request, now=1.5), samples)
    flying: collections.deque[Route] = collections.deque()
    for _ in range(32):
        flying.append(router.route("scale", request, now=1.5))
        router.begin(flying[-1])
    busy = per_call_us(lambda: router.route("scale", request, now=1.5), samples)

    # As a router under load decides: each decision's dispatch begun and the oldest of
    # the 32 ended, so every decision re-costs the pipelines those two touched (the
    # three calls timed together).
    def churn() -> None:
        route = router.route("scale", request, now=1.5)
        router.begin(route)
        router.end(flying.popleft())
        flying.append(route)

    churning = per_call_us(churn, samples)
    picked: Route = router.route("scale", request, now=1.5)
    # The answer timed is the least cost over every pipeline, walked here in full.
    walked = min(
        (
            base
            + inflight_cost(sum(router.in_flight(s.node_id) for s in p.stages))
            + router.link(p, 1.5),
            pid,
        )
        for base, pid, p in router.state.cost_table("scale")
    )
    assert picked.pipeline_id == walked[1], (picked, walked)
    # A new snapshot: the state rebuilt from it, adopted, and the first decision.
    heard = dict(state.nodes)
    times = []
    for i in range(5):
        heard["n0-0"] = NodeState(latency_ms=1.0 + i, load=0.5, score=1.0)
        started = time.perf_counter()
        router.update(SwarmState(state.plan, heard))
        router.route("scale", request, now=1.5)
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {
        "route_idle_us": idle,
        "route_measured_us": measured,
        "route_busy_us": busy,
        "route_churn_us": churning,
        "snapshot_ms": round(times[len(times) // 2], 2),
    }


def _published(procs: Supervisor) -> tuple[int, int]:
    """The plans the planner published, and the shares it wrote for them in all."""
    plans = shares = 0
    for line in procs.log("planner").splitlines():
        if '"plan published"' in line or '"plan shares written"' in line:
            with contextlib.suppress(ValueError):
                shares += int(json.loads(line).get("shares", 0))
                plans += '"plan published"' in line
    return plans, shares


def one_size(
    size: int,
    *,
    heartbeat_ms: int,
    steady_s: float,
    form_timeout_s: float,
    tmp: Path,
    routers: int = 1,
    shards: int = 1,
    models: int = 1,
) -> dict[str, Any]:
    server = NatsServer(tmp / f"nats-{size}-{routers}-{shards}").start()
    logs = tmp / f"logs-{size}-{routers}-{shards}"
    logs.mkdir(parents=True, exist_ok=True)
    procs = Supervisor(env={**os.environ, "HECATE_LOG_LEVEL": "WARNING"}, logs=logs)
    try:
        url = server.url
        replicas = [f"telemetry-{k}" for k in range(shards)]
        for k, label in enumerate(replicas):
            sharded = ("--shards", str(shards), "--shard", str(k))
            procs.start(ProcessSpec(label, ("telemetry", "--id", label, *sharded, "--nats", url)))
        # A router following the swarm (plan and telemetry), with nothing to route.
        followers = [f"router-{i}" for i in range(routers)]
        for label in followers:
            procs.start(ProcessSpec(label, ("router", "--id", label, "--nats", url)))
        # The planner from the start, as a swarm's: its notices tell the nodes how many
        # members there are before any plan, and they pace their beats by it.
        topology = tmp / f"topology-{size}.json"
        topology.write_text(json.dumps(TWO_MODELS if models == 2 else TOPOLOGY))
        planner = ("planner", "--id", "planner", "--topology", str(topology))
        procs.start(
            ProcessSpec(
                "planner",
                (*planner, *PLAN_ARGS, "--nats", url),
                env={"HECATE_LOG_LEVEL": "INFO"},  # its "plan published" records
            )
        )
        hosts = []
        for h, start in enumerate(range(0, size, PER_HOST)):
            count = min(PER_HOST, size - start)
            label = f"host-{h}"
            argv: tuple[str, ...] = ("node-host", "--prefix", f"h{h}-", "--count", str(count))
            argv += ("--capacity-layers", "8", "--heartbeat-ms", str(heartbeat_ms))
            argv += ("--heartbeat-most-ms", str(MOST_MS))
            argv += ("--start-per-s", str(STARTS_PER_S / -(-size // PER_HOST)))
            procs.start(ProcessSpec(label, (*argv, "--nats", url)))
            hosts.append(label)
        snap, snapshot_bytes, waited = asyncio.run(
            _poll(url, _read_telemetry, lambda s: _alive_count(s) >= size, form_timeout_s)
        )
        alive = _alive_count(snap)
        plan, plan_bytes, planned_s = asyncio.run(
            _poll(url, _read_plan, lambda p: _planned_count(p) >= alive, form_timeout_s)
        )
        planned_nodes = _planned_count(plan)
        pipelines = len(plan.pipelines) if plan else 0
        beat_s = beat_interval(heartbeat_ms / 1000, size, BEAT_BUDGET_PER_S, MOST_MS / 1000)
        pids = {label: procs.pid(label) for label in (*hosts, *replicas, *followers)}
        server_pid = server.process.pid if server.process else 0
        server_before = cpu_seconds(server_pid) or 0.0
        before = {label: cpu_seconds(pid) or 0.0 for label, pid in pids.items()}
        heard_before = asyncio.run(_heard(url, replicas))
        measured_from = time.monotonic()
        # The follower's own counts cover its steady_s in step; everything else, the
        # whole window (its start and catching up included).
        followed = asyncio.run(_follow(url, steady_s))
        heard_after = asyncio.run(_heard(url, replicas))
        window = time.monotonic() - measured_from
        after = {label: cpu_seconds(pid) or 0.0 for label, pid in pids.items()}
        host_rss = [rss_mb(pids[label]) or 0.0 for label in hosts]
        failures = [why for label in hosts if (why := _failure(procs, label)) is not None]
        hosts_cpu = sum(after[h] - before[h] for h in hosts) / window
        shard_cpu = [(after[r] - before[r]) / window for r in replicas]
        telemetry_cpu = sum(shard_cpu)
        # Beats taken per second, per replica, over the window (the few ms between the
        # CPU readings and the counts aside); what the nodes' pace says they send is
        # size / beat_s.
        heard = [(heard_after[r][0] - heard_before[r][0]) / window for r in replicas]
        missed = sum(heard_after[r][1] - heard_before[r][1] for r in replicas)
        plans, shares = _published(procs)
        level = {
            "nodes": size,
            "hosts": len(hosts),
            "alive": alive,
            "formed": alive >= size,
            "all_alive_s": round(waited, 1),
            "planned_nodes": planned_nodes,
            "pipelines": pipelines,
            "planned_s": round(planned_s, 1),
            "plan_bytes": plan_bytes,
            "plans_published": plans,
            "shares_written": shares,
            "beat_s": round(beat_s, 2),
            "host_rss_mb": [round(r) for r in host_rss],
            # Hosts that exited while measured, and the first failure each logged.
            "host_failures": failures,
            "rss_per_node_mb": round(sum(host_rss) / size, 3),
            "hosts_cpu_per_s": round(hosts_cpu, 3),
            "host_cpu_us_per_node_per_s": round(hosts_cpu / size * 1e6, 1),
            "telemetry_cpu_per_s": round(telemetry_cpu, 3),
            "telemetry_cpu_us_per_beat": round(telemetry_cpu / (size / beat_s) * 1e6, 1),
            "telemetry_rss_mb": round(sum(rss_mb(pids[r]) or 0.0 for r in replicas)),
            "telemetry_shards": shards,
            "shard_cpu_per_s": [round(c, 3) for c in shard_cpu],
            "beats_expected_per_s": round(size / beat_s),
            "beats_heard_per_s": [round(h) for h in heard],
            # Beats whose numbers never arrived, over the window (every replica).
            "beats_missed": missed,
            "snapshot_bytes": snapshot_bytes,
            "snapshot_updates_per_s": round(followed.deltas / steady_s, 1),
            "follow_bytes_per_s": round(
                (followed.delta_bytes + followed.snapshot_bytes) / steady_s
            ),
            # Of which snapshots read again (a delta missed), and the deltas missed.
            "follow_snapshots": followed.snapshots,
            "follow_snapshot_bytes": followed.snapshot_bytes,
            "follow_gaps": followed.gaps,
            "routers": routers,
            "models": models,
            "copies_by_model": _copies(plan),
            # Per router, the mean over them; and the server's own CPU meanwhile.
            "router_cpu_per_s": round(
                sum(after[r] - before[r] for r in followers) / routers / window, 3
            ),
            "server_cpu_per_s": round(
                ((cpu_seconds(server_pid) or 0.0) - server_before) / window, 3
            ),
            "snapshot_bytes_per_node": round(snapshot_bytes / max(1, alive)),
        }
    finally:
        procs.stop()
        server.stop()
    # Measured with the swarm stopped: its processes would share the cores.
    return {**level, **decisions(size)}


def run_scale_bench(
    *,
    quick: bool = False,
    heartbeat_ms: int = 1000,
    sizes: tuple[int, ...] | None = None,
    cutoff_racks: int | None = None,
) -> dict[str, Any]:
    """Every size, then several routers, then a shared heartbeat intake, then the
    cut-off on hosts apart (``cutoff_racks`` racks of 100 nodes, 0 for none; skipped,
    saying why, where network namespaces cannot be made)."""
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    steady = QUICK_STEADY_S if quick else STEADY_S
    with tempfile.TemporaryDirectory(prefix="hecate-scale-") as tmp:

        def measured(size: int, **shape: int) -> dict[str, Any]:
            return one_size(
                size,
                heartbeat_ms=heartbeat_ms,
                steady_s=steady,
                form_timeout_s=30.0 + size / 50,
                tmp=Path(tmp),
                **shape,
            )

        levels = [measured(size) for size in sizes]
        # Several routers following one swarm of two models: what each costs, and the
        # server's fan-out.
        levels += [
            measured(size, routers=routers, models=2)
            for size, routers in (QUICK_ROUTER_LEVELS if quick else ROUTER_LEVELS)
        ]
        # The heartbeat intake shared by several telemetry replicas.
        levels += [
            measured(size, shards=shards)
            for size, shards in (QUICK_SHARD_LEVELS if quick else SHARD_LEVELS)
        ]
    # What one identity adds to a host: the slope between the two smallest sizes (each
    # one host), free of the process's own baseline.
    single = [lv for lv in levels if lv["routers"] == 1 and lv["telemetry_shards"] == 1]
    small, larger = (sorted(single, key=lambda lv: lv["nodes"]) * 2)[:2]
    slope = (
        (larger["host_rss_mb"][0] - small["host_rss_mb"][0]) / (larger["nodes"] - small["nodes"])
        if larger["nodes"] != small["nodes"]
        else small["rss_per_node_mb"]  # one size: the baseline included
    )
    racks = cutoff_racks if cutoff_racks is not None else (2 if quick else CUTOFF_RACKS)
    why_not = unavailable()
    cut: dict[str, Any] = (
        {"skipped": "no racks asked for"}
        if racks == 0
        else {"skipped": f"no network namespaces here: {why_not}"}
        if why_not is not None
        else cut_off(racks, rack=20 if quick else RACK)  # nodes beating at their default
    )
    return {
        "levels": levels,
        "cutoff": cut,
        "rss_added_per_node_mb": round(slope, 3),
        "meta": {
            "heartbeat_ms": heartbeat_ms,
            "beat_budget_per_s": BEAT_BUDGET_PER_S,
            "most_ms": MOST_MS,
            "per_host": PER_HOST,
            "starts_per_s": STARTS_PER_S,
            "executor": "toy",
            "steady_s": steady,
            "cpu_count": os.cpu_count(),
        },
    }
