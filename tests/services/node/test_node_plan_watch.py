"""A node's plan watch on a real nats-server outlives a plan entry that is not a plan:
it is logged, counted and skipped, and the next good plan is taken."""

from __future__ import annotations

import asyncio
import json
import logging

import msgspec
import pytest
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.wire import subjects
from hecate_node.config import NodeConfig
from hecate_node.service import Node
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


async def test_a_malformed_plan_is_skipped_and_the_next_good_one_taken(
    nats_server: NatsServer, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.node")
    plans = await kvs.bucket(client, subjects.PLAN_BUCKET)  # as the planner creates it
    first = await plans.put(subjects.PLAN_KEY, msgspec.json.encode(_plan(4)))
    profile = NodeProfile(node_id="watcher", capacity_layers=8, latency_ms=5.0)
    node = Node(NodeConfig(profile=profile, executor="null"), log=logging.getLogger("test.node"))
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(nats_server.url, stop, grace=1.0))
    try:
        await until(lambda: node.holdings.epoch == first, "the first plan adopted")
        assert node.holdings.held == [("toy", 0, 4)]

        # Valid JSON of the wrong shape, then not JSON at all: neither is a plan.
        wrong = json.dumps({"epoch": 1, "pipelines": "none"}).encode()
        await plans.put(subjects.PLAN_KEY, wrong)
        bad = await plans.put(subjects.PLAN_KEY, b"{not a plan")
        good = await plans.put(subjects.PLAN_KEY, msgspec.json.encode(_plan(6)))
        await until(
            lambda: node.holdings.epoch == good,
            f"the good plan at revision {good} adopted after the bad one at {bad}",
            timeout=10,
            last=f"epoch {node.holdings.epoch}, holding {node.holdings.held}",
        )
        assert node.holdings.held == [("toy", 0, 6)]
        # The watch may coalesce the two bad puts; each one it saw is counted once.
        assert 1 <= node.holdings.bad_plans <= 2
        skipped = [
            getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "bad plan skipped"
        ]
        assert len(skipped) == node.holdings.bad_plans
        assert skipped[-1]["revision"] == bad
        assert skipped[-1]["epoch"] == first  # the plan it kept meanwhile
        assert not task.done()
        assert node.service.failure is None
        stats = {e.name: e for e in node.service.endpoints}
        assert stats["run"].status is not None
        assert stats["run"].status()["bad_plans"] == node.holdings.bad_plans
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
