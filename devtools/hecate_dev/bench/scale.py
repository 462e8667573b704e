"""``hecate bench scale``: what a swarm of many nodes costs, size by size.

At each size, a nats-server, one telemetry service, one router, a planner and node
hosts (``hecate
node-host``: many node identities in one process, each a whole node on the bus) on the
toy executor, beating at ``heartbeat_ms``. Measured, per size: how long until telemetry
calls every node alive (``all_alive_s``, from the hosts' start); how long the planner,
started then, takes to publish a plan holding them all (``planned_s``: its settle time,
its roll-call and the planning; ``--pipelines auto``, a 48-layer base on nodes of 8);
each host's memory (RSS) and what one identity adds; the CPU the hosts and telemetry
spend per second once the swarm stands, per node; the telemetry snapshot every router follows: its
bytes, whole, and per node; and what following it costs a router: the updates and
bytes a second it receives, and the CPU a second of a router with nothing to route. A
size whose nodes are not all alive within ``form_timeout_s`` is recorded with how many
were, and the suite goes on.

Not yet here: planning and routing at these sizes under load, several routers, and
the cut-off namespace (the rest of the scale suite).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer
from hecate.core import SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import TelemetrySnapshot
from hecate_dev.bench.bus_setup import cpu_seconds
from hecate_launcher import ProcessSpec, Supervisor

T = TypeVar("T")
SIZES = (100, 500, 1000, 2000)
QUICK_SIZES = (50, 200)
# One base of 48 layers, every node holding 8: as many copies as the nodes can form.
TOPOLOGY = {"models": [{"id": "scale", "layers": 48}], "nodes": [{"id": "x", "capacity_layers": 8}]}
PLAN_ARGS = ("--pipelines", "auto", "--settle-ms", "500")
PER_HOST = 1000  # identities in one host process: about one core's worth at 1 s beats
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
    url: str, bucket: str, key: str, kind: type[T], done: Callable[[T], bool], timeout_s: float
) -> tuple[T | None, int, float]:
    """Read ``bucket``/``key`` as ``kind`` until ``done`` holds of it: the last value read
    (None: never written), its bytes, and the seconds waited."""
    started = time.monotonic()
    nc = await nats.connect(url)
    last: T | None = None
    size = 0
    try:
        while time.monotonic() - started < timeout_s:
            try:
                value, _revision = await kvs.get(await kvs.bucket(nc, bucket), key)
            except Exception:  # the bucket or the key not written yet
                value = None
            if value:
                last, size = msgspec.json.decode(value, type=kind), len(value)
                if done(last):
                    break
            await asyncio.sleep(0.25)
    finally:
        await nc.close()
    return last, size, time.monotonic() - started


def _alive_count(snap: TelemetrySnapshot | None) -> int:
    return 0 if snap is None else sum(t.alive for t in snap.nodes.values())


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


async def _follow(url: str, seconds: float) -> tuple[int, int]:
    """What following the telemetry snapshot brings a router over ``seconds``: updates
    and bytes (the router's own watch, :func:`hecate.bus.kv.watch`; the value current
    when it starts is not counted)."""
    nc = await nats.connect(url)
    updates = size = 0
    try:
        bucket = await kvs.bucket(nc, subjects.TELEMETRY_BUCKET)
        first = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                async for value, _revision in kvs.watch(bucket, subjects.TELEMETRY_KEY):
                    if first:
                        first = False
                        continue
                    if value:
                        updates += 1
                        size += len(value)
    finally:
        await nc.close()
    return updates, size


def one_size(
    size: int, *, heartbeat_ms: int, steady_s: float, form_timeout_s: float, tmp: Path
) -> dict[str, Any]:
    server = NatsServer(tmp / f"nats-{size}").start()
    logs = tmp / f"logs-{size}"
    logs.mkdir(parents=True, exist_ok=True)
    procs = Supervisor(env={**os.environ, "HECATE_LOG_LEVEL": "WARNING"}, logs=logs)
    try:
        url = server.url
        procs.start(ProcessSpec("telemetry", ("telemetry", "--id", "telemetry", "--nats", url)))
        # A router following the swarm (plan and telemetry), with nothing to route.
        procs.start(ProcessSpec("router", ("router", "--id", "router", "--nats", url)))
        hosts = []
        for h, start in enumerate(range(0, size, PER_HOST)):
            count = min(PER_HOST, size - start)
            label = f"host-{h}"
            argv: tuple[str, ...] = ("node-host", "--prefix", f"h{h}-", "--count", str(count))
            argv += ("--capacity-layers", "8", "--heartbeat-ms", str(heartbeat_ms))
            procs.start(ProcessSpec(label, (*argv, "--nats", url)))
            hosts.append(label)
        snap, snapshot_bytes, waited = asyncio.run(
            _poll(
                url,
                subjects.TELEMETRY_BUCKET,
                subjects.TELEMETRY_KEY,
                TelemetrySnapshot,
                lambda s: _alive_count(s) >= size,
                form_timeout_s,
            )
        )
        alive = _alive_count(snap)
        # The planner last, as a swarm's restarted one: it roll-calls every node up.
        topology = tmp / f"topology-{size}.json"
        topology.write_text(json.dumps(TOPOLOGY))
        planner = ("planner", "--id", "planner", "--topology", str(topology))
        procs.start(ProcessSpec("planner", (*planner, *PLAN_ARGS, "--nats", url)))
        plan, _, planned_s = asyncio.run(
            _poll(
                url,
                subjects.PLAN_BUCKET,
                subjects.PLAN_KEY,
                SwarmPlan,
                lambda p: _planned_count(p) >= alive,
                form_timeout_s,
            )
        )
        planned_nodes = _planned_count(plan)
        pipelines = len(plan.pipelines) if plan else 0
        pids = {label: procs.pid(label) for label in (*hosts, "telemetry", "router")}
        before = {label: cpu_seconds(pid) or 0.0 for label, pid in pids.items()}
        updates, followed = asyncio.run(_follow(url, steady_s))
        after = {label: cpu_seconds(pid) or 0.0 for label, pid in pids.items()}
        host_rss = [rss_mb(pids[label]) or 0.0 for label in hosts]
        failures = [why for label in hosts if (why := _failure(procs, label)) is not None]
        hosts_cpu = sum(after[h] - before[h] for h in hosts) / steady_s
        telemetry_cpu = (after["telemetry"] - before["telemetry"]) / steady_s
        return {
            "nodes": size,
            "hosts": len(hosts),
            "alive": alive,
            "formed": alive >= size,
            "all_alive_s": round(waited, 1),
            "planned_nodes": planned_nodes,
            "pipelines": pipelines,
            "planned_s": round(planned_s, 1),
            "host_rss_mb": [round(r) for r in host_rss],
            # Hosts that exited while measured, and the first failure each logged.
            "host_failures": failures,
            "rss_per_node_mb": round(sum(host_rss) / size, 3),
            "hosts_cpu_per_s": round(hosts_cpu, 3),
            "host_cpu_us_per_node_per_s": round(hosts_cpu / size * 1e6, 1),
            "telemetry_cpu_per_s": round(telemetry_cpu, 3),
            "telemetry_cpu_us_per_beat": round(
                telemetry_cpu / (size * 1000 / heartbeat_ms) * 1e6, 1
            ),
            "telemetry_rss_mb": round(rss_mb(pids["telemetry"]) or 0.0),
            "snapshot_bytes": snapshot_bytes,
            "snapshot_updates_per_s": round(updates / steady_s, 1),
            "follow_bytes_per_s": round(followed / steady_s),
            "router_cpu_per_s": round((after["router"] - before["router"]) / steady_s, 3),
            "snapshot_bytes_per_node": round(snapshot_bytes / max(1, alive)),
        }
    finally:
        procs.stop()
        server.stop()


def run_scale_bench(*, quick: bool = False, heartbeat_ms: int = 1000) -> dict[str, Any]:
    sizes = QUICK_SIZES if quick else SIZES
    steady = QUICK_STEADY_S if quick else STEADY_S
    with tempfile.TemporaryDirectory(prefix="hecate-scale-") as tmp:
        levels = [
            one_size(
                size,
                heartbeat_ms=heartbeat_ms,
                steady_s=steady,
                form_timeout_s=30.0 + size / 50,
                tmp=Path(tmp),
            )
            for size in sizes
        ]
    one_mb = 1024 * 1024
    # What one identity adds to a host: the slope between the two smallest sizes (each
    # one host), free of the process's own baseline.
    small, larger = sorted(levels, key=lambda lv: lv["nodes"])[:2]
    slope = (larger["host_rss_mb"][0] - small["host_rss_mb"][0]) / (
        larger["nodes"] - small["nodes"]
    )
    largest = max(levels, key=lambda lv: lv["nodes"])
    per_node = largest["snapshot_bytes_per_node"] or 1
    return {
        "levels": levels,
        "rss_added_per_node_mb": round(slope, 3),
        # Where the one-value snapshot stops: NATS's default max_payload.
        "snapshot_limit_nodes": one_mb // per_node,
        "meta": {
            "heartbeat_ms": heartbeat_ms,
            "per_host": PER_HOST,
            "executor": "toy",
            "steady_s": steady,
            "cpu_count": os.cpu_count(),
        },
    }
