"""A node process batches the generation steps that reach it together.

Eight prompts sent at once to one first-stage node, each its own session: the node
serves them side by side, its compute thread runs the ones that waited together as one
batch, and each gets the reply it gets alone. Its ``$SRV.STATS`` say so (a node that
served its run subject one message at a time ran every step alone, and this fails)."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from nats.aio.client import Client

from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import StepStage, TokenReply
from hecate_dev.bench.concurrency import PROMPTS
from hecate_planner.planstore import publish_by_hand
from tests.support.swarm import Processes
from tests.support.waits import until
from tests.system.test_swarm_generation import MODEL

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

_reply = msgspec.msgpack.Decoder(TokenReply)


def step(prompt: str, session: str) -> StepStage:
    return StepStage(
        request_id=session,
        model_id=MODEL,
        layer_start=0,
        layer_end=30,
        model_layers=30,
        epoch=1,
        prompt=prompt,
        session=session,
    )


async def run(client: Client, req: StepStage) -> TokenReply:
    msg = await client.request(subjects.node_run("solo"), msgspec.msgpack.encode(req), timeout=120)
    return _reply.decode(msg.data)


async def stats(client: Client) -> dict[str, int]:
    msg = await client.request("$SRV.STATS.hecate-node", b"", timeout=5)
    run_endpoint = next(e for e in json.loads(msg.data)["endpoints"] if e["name"] == "run")
    return dict(run_endpoint["data"])


async def test_steps_that_arrive_together_run_as_one_batch_and_answer_as_alone(
    processes: Processes, client: Client
) -> None:
    plan = SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id=MODEL, layers=30, executor="smollm2"),),
        nodes=(NodeProfile(node_id="solo", capacity_layers=30),),
        pipelines=(
            Pipeline(
                pipeline_id="p",
                model_id=MODEL,
                stages=(Stage(node_id="solo", layer_start=0, layer_end=30),),
            ),
        ),
    )
    await publish_by_hand(client, plan)
    processes.start(
        "node-solo", "node", "--id", "solo", "--capacity-layers", "30", "--executor", "smollm2"
    )

    async def warmed() -> bool:
        try:
            return (await stats(client)).get("latency_ms") is not None
        except Exception:
            return False

    await until(warmed, "the node has loaded and warmed up its range", timeout=120)
    prompts = PROMPTS[:8]
    alone = [await run(client, step(p, f"alone-{i}")) for i, p in enumerate(prompts)]
    before = await stats(client)
    together = await asyncio.gather(
        *(run(client, step(p, f"together-{i}")) for i, p in enumerate(prompts))
    )
    after = await stats(client)
    assert [r.token for r in together] == [r.token for r in alone]
    assert all(r.ok for r in together)
    batches = after["batches"] - before["batches"]
    steps = after["batched_steps"] - before["batched_steps"]
    assert steps == len(prompts)
    assert batches < len(prompts), "every step ran alone"
    assert after["largest_batch"] > 1
