"""``hecate node-host``: many node identities in one process, each a whole node on the
bus. A real nats-server, telemetry, planner and router as processes; the host killed
with SIGKILL takes every identity with it, and the swarm says so."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus import telemetry
from hecate.bus.server import NatsServer
from hecate.core import NodeProfile, SwarmPlan
from hecate.wire import subjects
from hecate_node.config import NodeConfig
from hecate_node.host import IdentityFailed, NodeHost, identities
from tests.support.swarm import Processes, infer, start_planner, start_router, wait_until_serving
from tests.support.waits import until

MODEL = "hosted"


def test_identities_are_numbered_so_that_they_sort() -> None:
    assert identities("h-", 3) == ["h-0", "h-1", "h-2"]
    assert identities("h-", 12)[:2] == ["h-00", "h-01"]
    assert sorted(identities("h-", 12)) == identities("h-", 12)


@pytest.fixture
def topology(tmp_path: Path) -> Path:
    path = tmp_path / "hosted.json"
    nodes = [{"id": f"x{i}", "capacity_layers": 4} for i in range(6)]  # the planner's own
    path.write_text(json.dumps({"models": [{"id": MODEL, "layers": 12}], "nodes": nodes}))
    return path


async def test_six_identities_in_one_process_form_every_copy_and_die_with_it(
    processes: Processes, client: Client, topology: Path
) -> None:
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    start_router(processes, "router-1", topology)
    host = processes.start(
        "host", "node-host", "--prefix", "h", "--count", "6", "--capacity-layers", "6"
    )
    # Every identity heard before the planner's roll-call: its first plan holds them.
    await until(lambda: alive(client, 6), "telemetry hears six identities", timeout=20.0)
    start_planner(processes, topology, "auto")
    await wait_until_serving(client, MODEL)
    plans = await kvs.bucket(client, subjects.PLAN_BUCKET)
    plan = msgspec.json.decode((await plans.get(subjects.PLAN_KEY)).value or b"", type=SwarmPlan)
    assert sorted(n.node_id for n in plan.nodes) == identities("h", 6)
    assert len(plan.pipelines) == 3  # 36 layers of capacity, a 12-layer model: auto
    assert plan.spare_nodes() == ()
    for _ in range(5):
        assert (await infer(client, MODEL, "through the host")).ok

    processes.kill("host", signal.SIGKILL)
    assert host.wait(timeout=5) == -signal.SIGKILL

    await until(lambda: alive(client, 0), "telemetry calls every identity down", timeout=10.0)
    reply = await infer(client, MODEL, "nobody left")
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code == "no_healthy_pipeline"
    assert "down: h0, h1, h2, h3, h4, h5" in reply.error.message


async def alive(client: Client, count: int) -> bool:
    """Whether telemetry's snapshot calls exactly ``count`` nodes alive (and has some)."""
    try:
        snap = await telemetry.read(await kvs.bucket(client, subjects.TELEMETRY_BUCKET))
    except Exception:  # the bucket not there yet
        return False
    if snap is None or not snap.nodes:
        return False
    return sum(t.alive for t in snap.nodes.values()) == count


async def test_an_identity_whose_loop_fails_stops_the_host_with_its_name(
    nats_server: NatsServer,
) -> None:
    """As one node process exits nonzero when a loop of it fails, a host does: the
    group stops every identity and the failure names the one that failed."""
    configs = [
        NodeConfig(profile=NodeProfile(node_id=node_id, capacity_layers=4))
        for node_id in identities("f", 2)
    ]
    host = NodeHost(configs, log=logging.getLogger("test.host"))
    stop = asyncio.Event()
    task = asyncio.create_task(host.run(nats_server.url, stop, grace=1.0))
    await until(
        lambda: all(n.service.loops.failure is None and n._beating for n in host.nodes),
        "both identities beat",
    )

    async def broken() -> None:
        raise RuntimeError("the watch broke")

    host.nodes[1].service.spawn(broken())
    with pytest.raises(ExceptionGroup) as raised:
        await asyncio.wait_for(task, 15)
    failed = [e for e in raised.value.exceptions if isinstance(e, IdentityFailed)]
    assert len(failed) == 1
    assert "node f1" in str(failed[0])
    assert "the watch broke" in str(failed[0])
