"""One bad request never hurts anyone else, on real processes: a seed past int64, a
negative seed, a subnormal temperature and tools that are no array of functions, sent
straight on the bus beside innocent requests. Each hostile one gets its own typed
answer (refused at the router's intake, or computed as asked); every innocent one is
answered; no node is failed over from or reported to the breakers, and the router
that took them all is still there."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from hecate.bus.settle import settled
from hecate.llm.store import pull
from hecate.wire import subjects
from hecate.wire.messages import ErrorReply, Heartbeat, InferReply, StepStage
from tests.support.swarm import Processes, start_planner
from tests.support.waits import router_status, until

pytestmark = pytest.mark.usefixtures("prepared_model")

MODEL = "smollm2-135m"
_reply = msgspec.json.Decoder(InferReply)
_beat = msgspec.json.Decoder(Heartbeat)
_stage = msgspec.msgpack.Encoder()
_error = msgspec.msgpack.Decoder(ErrorReply)


def start(processes: Processes, tmp_path: Path) -> None:
    pull(MODEL, progress=lambda _line: None)
    topology = tmp_path / "llm.json"
    model = {"id": MODEL, "layers": 30, "role": "base", "executor": "smollm2"}
    node = {"id": "a", "capacity_layers": 30, "executor": "smollm2"}
    topology.write_text(json.dumps({"models": [model], "nodes": [node]}))
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    start_planner(processes, topology, 1)
    processes.start("router-1", "router", "--id", "router-1", "--stage-timeout-ms", "5000")
    processes.start(
        "node-a", "node", "--id", "a", "--capacity-layers", "30", "--executor", "smollm2"
    )


async def serving(client: Client) -> bool:
    try:
        return (await ask(client, {"prompt": "Hi", "max_tokens": 1})).ok
    except Exception:
        return False


async def ask(client: Client, body: dict[str, Any]) -> InferReply:
    data = json.dumps({"max_tokens": 3, **body}).encode()
    msg = await client.request(subjects.infer(MODEL), data, timeout=60)
    return _reply.decode(msg.data)


async def test_hostile_requests_are_answered_alone_and_hurt_no_one(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    start(processes, tmp_path)
    await until(lambda: serving(client), "the model served", timeout=120)
    innocent: dict[str, Any] = {
        "prompt": "",
        "messages": [{"role": "user", "content": "Capital of France?"}],
    }
    refused: list[dict[str, Any]] = [
        {"prompt": "hi", "seed": 2**64},
        {"prompt": "hi", "seed": -(2**63) - 1},
        {**innocent, "tools": "1"},
        {**innocent, "tools": "null"},
        {**innocent, "tools": "[" * 3000 + "]" * 3000},
    ]
    sampled: list[dict[str, Any]] = [
        {"prompt": "Once upon a time", "seed": -1, "temperature": 0.7},
        {"prompt": "Once upon a time", "temperature": 1e-310},
        {"prompt": "Once upon a time", "seed": 2**63 - 1, "temperature": 1.0},
    ]
    bodies: list[dict[str, Any]] = [*refused, *sampled, innocent, innocent, innocent]
    for _ in range(2):  # a second round: after the first, the router is still the one
        answers = await asyncio.gather(*(ask(client, b) for b in bodies))
        for body, reply in zip(refused, answers, strict=False):
            assert not reply.ok, body
            assert reply.error is not None
            assert reply.error.code == "bad_request", (body, reply.error)
        for reply in answers[len(refused) :]:
            assert reply.ok, reply.error
        await asyncio.sleep(1.0)  # stage deadlines swept meanwhile: the router lives on
        assert processes.procs["router-1"].poll() is None, processes.log("router-1")
    status = await router_status(client, "router-1")
    assert status is not None
    counters = status["counters"]
    assert counters.get("failovers", 0) == 0, counters
    assert counters.get("acts_failed", 0) == 0
    assert counters.get("sweep_failed", 0) == 0
    assert status["admission"]["in_flight"] == {}, status  # nothing held by a refusal
    assert "step failed" not in processes.log("node-a")


async def test_a_burst_of_long_prompts_never_silences_a_node(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    """Forty distinct prompts of 60,000 digits sent to a node at once, every one past
    the context: each is tokenized off the node's event loop and refused as too long,
    and its heartbeats keep their pace. (Tokenized on the loop, as the batching asked
    each waiting step its rows, they held it 80 ms each, one after another: seconds
    without a beat, and telemetry called the node down.)"""
    start(processes, tmp_path)
    await until(lambda: serving(client), "the model served", timeout=120)
    status = await router_status(client, "router-1")
    assert status is not None
    beats: list[Heartbeat] = []
    downs: list[bytes] = []

    async def on_beat(msg: Any) -> None:
        beats.append(_beat.decode(msg.data))

    async def on_down(msg: Any) -> None:
        downs.append(msg.data)

    await client.subscribe(subjects.intake("*", "a"), cb=on_beat)
    await client.subscribe(subjects.EVENT_NODE_DOWN, cb=on_down)
    await settled(client)
    rng = random.Random(7)

    async def step(i: int) -> bytes:
        stage = StepStage(
            request_id=f"long-{i}",
            model_id=MODEL,
            layer_start=0,
            layer_end=30,
            model_layers=30,
            epoch=int(status["plan_epoch"]),
            session=f"long-{i}",
            prompt="".join(rng.choices("0123456789", k=60_000)),
            decode_tokens=1,
        )
        msg = await client.request(subjects.node_run("a"), _stage.encode(stage), timeout=60)
        return msg.data

    answers = [_error.decode(a) for a in await asyncio.gather(*(step(i) for i in range(40)))]
    assert {a.error.code for a in answers} == {"prompt_too_long"}, answers[0]
    innocent = await ask(client, {"prompt": "The capital of France is"})
    assert innocent.ok, innocent.error
    assert downs == [], downs
    assert len(beats) >= 2
    pace = beats[-1].interval_ms / 1000
    late = [b.sent_at - a.sent_at for a, b in itertools.pairwise(beats)]
    # Three paces: the node's own loop may be busy a moment (a batch's results, a
    # beat's own send); a prompt's tokenizing on it took one pace per prompt.
    assert max(late) < 3 * pace, late
