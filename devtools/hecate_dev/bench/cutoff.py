"""The scale suite's cut-off: a rack of nodes loses its cable while requests flow.

The swarm stands on hosts apart (:class:`hecate_dev.apart.ApartSwarm`: a NATS cluster of
three servers each on its own host, the services on another, each rack of nodes on its
own). With requests flowing (``at_once`` at a time, every answer checked against the
single-process one), rack 0's cable is pulled. Measured: when telemetry called each of
its nodes down, from the cut (p50, p99, the last); the requests answered, wrong and
failed over the whole run, and their latency in the seconds after the cut; when the
planner published a plan holding none of the rack's nodes, and how many plans it
published from the cut until then; and, once the cable is back, when every node was
alive and planned again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.core import SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import NodeEvent, PlanChanged
from hecate_dev.apart import ApartSwarm, Load, alive, plan_nodes
from hecate_dev.bench.concurrency import percentile

RACK = 100  # nodes a rack
AFTER_S = 10.0  # how long the requests after the cut are watched


async def _until(check: Any, timeout_s: float, poll_s: float = 0.1) -> float | None:
    """Seconds until ``await check()`` holds (None: not within ``timeout_s``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if await check():
            return time.monotonic() - started
        await asyncio.sleep(poll_s)
    return None


async def _plan(client: Client) -> tuple[set[str], int]:
    """The nodes of the plan now and its epoch (KV revision); nothing and 0 when it
    cannot be read."""
    with contextlib.suppress(Exception):
        bucket = await kvs.bucket(client, subjects.PLAN_BUCKET)
        value, revision = await kvs.get(bucket, subjects.PLAN_KEY)
        if value:
            plan = msgspec.json.decode(value, type=SwarmPlan)
            return {n.node_id for n in plan.nodes}, revision
    return set(), 0


async def _followed(client: Client, routers: int) -> dict[str, int]:
    """What following telemetry has cost the routers so far, summed: deltas and their
    bytes, snapshots read again and theirs, deltas missed (their ``$SRV.STATS``)."""
    name = subjects.SERVICE_NAMES["router"]
    out: dict[str, int] = {}
    for r in range(routers):
        with contextlib.suppress(Exception):
            msg = await client.request(f"$SRV.STATS.{name}.router-{r}", b"", timeout=5)
            for endpoint in json.loads(msg.data)["endpoints"]:
                for key, value in (
                    (endpoint.get("data") or {}).get("telemetry_followed") or {}
                ).items():
                    out[key] = out.get(key, 0) + int(value)
    return out


async def _measure(
    swarm: ApartSwarm, racks: int, rack: int, *, at_once: int, form_s: float, after_s: float
) -> dict[str, Any]:
    everyone = set().union(*(swarm.rack_nodes(i, rack) for i in range(racks)))
    cut = swarm.rack_nodes(0, rack)
    client = await nats.connect(swarm.url)
    downs: dict[str, float] = {}
    plans: set[int] = set()  # the epochs the planner announced

    async def heard(msg: Msg) -> None:
        news = msgspec.json.decode(msg.data, type=NodeEvent)
        downs.setdefault(news.node_id, time.monotonic())

    async def planned(msg: Msg) -> None:
        with contextlib.suppress(msgspec.DecodeError):
            plans.add(msgspec.json.decode(msg.data, type=PlanChanged).epoch)

    try:
        await client.subscribe(subjects.EVENT_NODE_DOWN, cb=heard)
        await client.subscribe(subjects.EVENT_PLAN, cb=planned)

        async def formed() -> bool:
            return await plan_nodes(client) == everyone and await alive(client) >= everyone

        formed_s = await _until(formed, form_s)
        if formed_s is None:
            return {"formed": False, "alive": len(await alive(client))}
        load = Load(client, swarm.model, swarm.layers, at_once=at_once)
        stop = asyncio.Event()
        flowing = asyncio.create_task(load.run(stop))
        await asyncio.sleep(min(3.0, after_s))  # requests flowing before the cut
        before = len(load.latencies)
        routers = swarm.routers
        followed_from, followed_at = await _followed(client, routers), time.monotonic()
        downs.clear()
        _nodes, epoch_at_cut = await _plan(client)
        cut_at = time.monotonic()
        swarm.racks[0].cut()

        async def all_down() -> bool:
            return cut <= downs.keys()

        await _until(all_down, 30)

        repaired_epoch = 0

        async def repaired() -> bool:
            nonlocal repaired_epoch
            planned, repaired_epoch = await _plan(client)
            return bool(planned) and not planned & cut

        repaired_s = await _until(repaired, 60)
        repaired_s = None if repaired_s is None else time.monotonic() - cut_at

        async def announced() -> bool:  # the planner announces a plan once its shares are out
            return repaired_epoch in plans

        await _until(announced, 10)
        # Plans published from the cut until the one that held none of the rack.
        plans_until = len({e for e in plans if epoch_at_cut < e <= repaired_epoch})
        rest = after_s - (time.monotonic() - cut_at)
        if rest > 0:
            await asyncio.sleep(rest)
        after = load.latencies[before:]
        followed_to, took = await _followed(client, routers), time.monotonic() - followed_at
        followed = {k: v - followed_from.get(k, 0) for k, v in followed_to.items()}
        swarm.racks[0].heal()
        back_s = await _until(formed, 90)
        stop.set()
        await flowing
        called = sorted(downs[n] - cut_at for n in cut if n in downs)
        return {
            "formed": True,
            "formed_s": round(formed_s, 1),
            "called_down": len(called),
            "down_p50_s": round(percentile(called, 50), 2) if called else None,
            "down_p99_s": round(percentile(called, 99), 2) if called else None,
            "down_last_s": round(called[-1], 2) if called else None,
            "answered": load.answered,
            "wrong": load.wrong,
            "failed": load.failed,
            "errors": load.errors[:5],
            "after_cut_requests": len(after),
            "after_cut_p50_ms": round(percentile(after, 50) * 1000, 1) if after else None,
            "after_cut_p99_ms": round(percentile(after, 99) * 1000, 1) if after else None,
            "repaired_s": None if repaired_s is None else round(repaired_s, 1),
            "plans_until_repaired": plans_until,
            "back_s": None if back_s is None else round(back_s, 1),  # from the heal
            # A router following telemetry under load and through the cut, per second.
            "follow_bytes_per_s": round(
                (followed.get("delta_bytes", 0) + followed.get("snapshot_bytes", 0))
                / took
                / max(1, routers)
            ),
            "follow_deltas_per_s": round(followed.get("deltas", 0) / took / max(1, routers), 1),
            "follow_snapshots": followed.get("snapshots", 0),
            "follow_gaps": followed.get("gaps", 0),
        }
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def cut_off(
    racks: int = 10,
    *,
    rack: int = RACK,
    at_once: int = 8,
    heartbeat_ms: int = 100,  # a node's default: paced by the swarm's beat budget
    shards: int = 1,
    after_s: float = AFTER_S,
    planner_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Stand ``racks`` racks of ``rack`` nodes apart, load them, cut rack 0 off; the
    requests answered in the ``after_s`` after the cut are timed."""
    with tempfile.TemporaryDirectory(prefix="hecate-cutoff-") as tmp:
        layers = 48 if rack * (racks - 1) >= 6 * 2 else 24  # two copies left after the cut
        swarm = ApartSwarm(
            Path(tmp),
            [rack] * racks,
            layers=layers,
            heartbeat_ms=heartbeat_ms,
            shards=shards,
            start_per_s=400.0 / racks,
            log_level="WARNING",
            planner_args=planner_args,
        )
        try:
            form_s = 60 + racks * rack / 10
            measured = asyncio.run(
                _measure(swarm, racks, rack, at_once=at_once, form_s=form_s, after_s=after_s)
            )
        finally:
            swarm.close()
    return {
        "nodes": racks * rack,
        "racks": racks,
        "cut": rack,
        "layers": layers,
        "heartbeat_ms": heartbeat_ms,
        "telemetry_shards": shards,
        "at_once": at_once,
        "after_s": after_s,
        **measured,
    }
