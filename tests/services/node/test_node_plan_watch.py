"""A node holds its own share of the plan on a real nats-server: read at start, and
again when a plan notice names it, names nobody or follows one it missed; a share or a
notice that does not decode is logged, counted and skipped, and the next good one taken.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import msgspec
import pytest
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import Assignment, Held, PlanChanged
from hecate_node.config import NodeConfig
from hecate_node.service import Node
from hecate_planner.planstore import publish_by_hand
from tests.support.waits import until


def _plan(layers: int) -> SwarmPlan:
    profile = NodeProfile(node_id="watcher", capacity_layers=8, latency_ms=5.0)
    return SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id="toy", layers=layers, executor="null"),),
        nodes=(profile,),
        pipelines=(
            Pipeline(
                pipeline_id="toy-p1",
                model_id="toy",
                stages=(Stage(node_id="watcher", layer_start=0, layer_end=layers),),
            ),
        ),
    )


def _share(epoch: int, layers: int) -> bytes:
    held = Held(model_id="toy", layer_start=0, layer_end=layers, executor="null")
    return msgspec.json.encode(Assignment(node_id="watcher", epoch=epoch, holdings=(held,)))


def _notice(epoch: int, previous: int, changed: tuple[str, ...] | None) -> bytes:
    return msgspec.json.encode(
        PlanChanged(
            epoch=epoch,
            strategy="test",
            planner_id="test",
            pipelines=1,
            reason="test",
            at=time.time(),
            previous=previous,
            nodes=1,
            changed=changed,
        )
    )


def _node() -> Node:
    profile = NodeProfile(node_id="watcher", capacity_layers=8, latency_ms=5.0)
    return Node(NodeConfig(profile=profile, executor="null"), log=logging.getLogger("test.node"))


async def test_a_malformed_share_or_notice_is_skipped_and_the_next_good_one_taken(
    nats_server: NatsServer, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.node")
    first = await publish_by_hand(client, _plan(4))
    plans = await kvs.bucket(client, subjects.PLAN_BUCKET)
    node = _node()
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(nats_server.url, stop, grace=1.0))
    try:
        await until(lambda: node.holdings.epoch == first, "the first share adopted")
        assert node.holdings.held == [("toy", 0, 4)]

        # Valid JSON of the wrong shape, then a notice that is not JSON: neither counts.
        wrong = json.dumps({"node_id": "watcher", "epoch": "x"}).encode()
        bad = await plans.put(subjects.assignment_key("watcher"), wrong)
        await client.publish(subjects.EVENT_PLAN, _notice(bad, first, ("watcher",)))
        await client.publish(subjects.EVENT_PLAN, b"{not a notice")
        await until(lambda: node.holdings.bad_plans == 2, "both counted")
        assert node.holdings.held == [("toy", 0, 4)]  # kept meanwhile
        good = await publish_by_hand(client, _plan(6))
        await until(
            lambda: node.holdings.epoch == good,
            f"the good share at {good} adopted after the bad one at {bad}",
            timeout=10,
            last=f"epoch {node.holdings.epoch}, holding {node.holdings.held}",
        )
        assert node.holdings.held == [("toy", 0, 6)]
        skipped = [
            getattr(r, "fields", {})
            for r in caplog.records
            if r.getMessage() in ("bad share skipped", "bad plan notice skipped")
        ]
        assert len(skipped) == node.holdings.bad_plans == 2
        assert skipped[0]["revision"] == bad
        assert skipped[0]["epoch"] == first  # the share it kept meanwhile
        assert not task.done()
        assert node.service.failure is None
        stats = {e.name: e for e in node.service.endpoints}
        assert stats["run"].status is not None
        assert stats["run"].status()["bad_plans"] == node.holdings.bad_plans
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_a_node_reads_its_share_only_when_a_notice_calls_for_it(
    nats_server: NatsServer, client: Client
) -> None:
    """A notice naming other nodes costs this one nothing; one naming it, naming
    nobody, or following an epoch it never heard of makes it read its share."""
    first = await publish_by_hand(client, _plan(4))
    plans = await kvs.bucket(client, subjects.PLAN_BUCKET)
    node = _node()
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(nats_server.url, stop, grace=1.0))
    key = subjects.assignment_key("watcher")
    try:
        await until(lambda: node.holdings.epoch == first, "the first share adopted")
        # The share changes, but the notice names someone else: not read.
        two = await plans.put(key, _share(first + 1, 5))
        await client.publish(subjects.EVENT_PLAN, _notice(two, first, ("other",)))
        await until(lambda: node.holdings.epoch == two, "the notice heard")
        assert node.holdings.held == [("toy", 0, 4)]
        # Named: read.
        three = await plans.put(key, _share(two + 1, 5))
        await client.publish(subjects.EVENT_PLAN, _notice(three, two, ("other", "watcher")))
        await until(lambda: node.holdings.held == [("toy", 0, 5)], "read when named")
        # Nobody named (too many to name): read.
        four = await plans.put(key, _share(three + 1, 6))
        await client.publish(subjects.EVENT_PLAN, _notice(four, three, None))
        await until(lambda: node.holdings.held == [("toy", 0, 6)], "read when nobody is named")
        # A notice that follows one the node missed (its previous is newer than the
        # node's epoch), even naming nobody in particular: read.
        five = await plans.put(key, _share(four + 1, 7))
        await client.publish(subjects.EVENT_PLAN, _notice(five + 10, five + 5, ()))
        await until(lambda: node.holdings.held == [("toy", 0, 7)], "read after a missed one")
        assert node.holdings.epoch == five + 10
        assert node.holdings.swarm_nodes == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
