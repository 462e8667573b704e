"""Two planner processes on one nats-server, both hearing every join and leave: every
write of the plan is a compare-and-set on the revision its writer read, and the swarm
ends with one plan both planners hold."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.errors import NoKeysError

from hecate.bus import kv as kvs
from hecate.core import SwarmPlan
from hecate.wire import subjects
from hecate_planner.service import plan_digest
from tests.support.swarm import EXAMPLES, SWARM_NODES, Processes

PLANNERS = {"planner-a": "greedy", "planner-b": "proportional"}
GROWTH = [("newcomer", 6, 6.0, 2.0), ("workstation", 12, 4.0, 3.0)]


def start_planner(processes: Processes, name: str, strategy: str) -> None:
    processes.start(
        name,
        "planner",
        "--id",
        name,
        "--topology",
        str(EXAMPLES / "swarm.json"),
        "--strategy",
        strategy,
        "--settle-ms",
        "300",
    )


async def planner_status(client: Client, name: str) -> dict[str, Any] | None:
    try:
        msg = await client.request(f"$SRV.STATS.hecate-planner.{name}", b"", timeout=1)
    except Exception:
        return None
    doc = json.loads(msg.data)
    return next((e["data"] for e in doc["endpoints"] if e["name"] == "join"), None)


async def stored(client: Client) -> tuple[SwarmPlan, int] | None:
    kv = await kvs.bucket(client, subjects.PLAN_BUCKET)
    try:
        entry = await kv.get(subjects.PLAN_KEY)
    except Exception:
        return None
    return msgspec.json.decode(entry.value or b"", type=SwarmPlan), int(entry.revision or 0)


async def settled_on(client: Client, members: set[str], within: float = 20.0) -> SwarmPlan:
    """The stored plan once both planners know exactly ``members``, have nothing left to
    publish, and hold that plan (same revision, same assignment). A node that only adds
    spare capacity may not be in it yet: it is published with the next change."""
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        found = await stored(client)
        if found is not None:
            plan, revision = found
            views = [await planner_status(client, name) for name in PLANNERS]
            last = (sorted(n.node_id for n in plan.nodes), revision, views)
            if {n.node_id for n in plan.nodes} <= members and all(
                v is not None
                and v["members"] == len(members)
                and not v["pending"]
                and v["epoch"] == revision
                and v["plan"] == plan_digest(plan)
                for v in views
            ):
                return plan
        await asyncio.sleep(0.05)
    raise AssertionError(f"the planners never settled on one plan of {sorted(members)}: {last}")


def published(processes: Processes) -> list[dict[str, Any]]:
    out = []
    for name in PLANNERS:
        for line in processes.log(name).splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("event") == "plan published":
                    out.append({**record, "by": name})
    return out


async def plan_history(client: Client) -> list[int]:
    """The plan key's stored revisions. nats-py's history is a watcher that may see its
    end-of-history marker before the entries on a loaded machine (NoKeysError for a key
    just read): asked again, a few times, before that counts."""
    kv = await kvs.bucket(client, subjects.PLAN_BUCKET)
    for _ in range(20):
        try:
            return [int(e.revision or 0) for e in await kv.history(subjects.PLAN_KEY)]
        except NoKeysError:
            await asyncio.sleep(0.1)
    raise AssertionError("the plan key has no history although the planners settled on it")


async def test_two_planners_racing_never_overwrite_each_other_blindly(
    processes: Processes, client: Client
) -> None:
    for name, strategy in PLANNERS.items():
        start_planner(processes, name, strategy)
    for name in PLANNERS:
        deadline = time.monotonic() + 15
        while await planner_status(client, name) is None:
            assert time.monotonic() < deadline, f"{name} never served its status"
            await asyncio.sleep(0.05)

    members = set()
    for node_id, capacity, latency, score in SWARM_NODES:
        processes.node(node_id, capacity, latency, score)
        members.add(node_id)
    await settled_on(client, members)
    for node_id, capacity, latency, score in GROWTH:  # each join reaches both planners
        processes.node(node_id, capacity, latency, score)
        members.add(node_id)
        await settled_on(client, members)
    processes.kill("node-pi", signal.SIGTERM)  # a leave, heard by both
    members.discard("pi")
    final = await settled_on(client, members)
    assert not final.validate()
    assert "pi" not in {n.node_id for n in final.nodes}

    history = await plan_history(client)
    writes = published(processes)
    assert len(history) < subjects.BUCKET_HISTORY[subjects.PLAN_BUCKET], "history was trimmed"
    # Every stored revision was written by one of the planners, as a compare-and-set on
    # the revision just before it: nobody wrote without having read what it replaced.
    assert sorted(w["epoch"] for w in writes) == history, (writes, history)
    for before, revision in zip([0, *history], history, strict=False):
        (write,) = [w for w in writes if w["epoch"] == revision]
        assert write["on"] == before, (write, history)
    # One change, one write: the planner that did not write took the other's plan.
    views = [await planner_status(client, name) for name in PLANNERS]
    assert all(v is not None for v in views)
    assert sum(v["adopted"] for v in views if v is not None) >= 1
