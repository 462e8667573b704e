"""Long prompts answer exactly the single-process text, hop by hop and down a chain.

test_long_prompt.py checks chained routes against llama.cpp (and ``prompt_too_long``);
here the answer must be the greedy text of our own model in one process, token for
token: a chunk's rows, batched or not, must add up to the state a one-process run
builds. Hop by hop every chunk's activation goes back to the router and on to the next
stage; down a chain the first stage runs the chunks ahead, several stages computing at
once."""

from __future__ import annotations

import asyncio
import functools
import math
import signal
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus.settle import settled
from hecate.llm.chunks import PREFILL_CHUNK
from hecate.llm.reference import greedy_text
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent, InferReply, InferRequest
from tests.support.swarm import Processes
from tests.support.waits import endpoint_data, stats, until
from tests.system.test_swarm_generation import MODEL, ready, start

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

# 1,200 tokens is five chunks hop by hop, every mechanism a longer prompt uses (its
# last chunk partial); 600 to 4,000 tokens run through chained stages in
# test_long_prompt.py against llama.cpp. The one-process reference computes the whole
# prefill again, here in the test: 2,000 tokens took 32 s of the suite, 4,000 more.
LENGTHS = (1200,)
TOKENS = 4
SENTENCE = "The keeper of the lighthouse wrote down every ship that passed the rocks. "


@functools.cache
def prompt(tokens: int) -> str:
    """A prompt of about ``tokens`` tokens that ends with a question to continue."""
    tok = load_tokenizer(pull(MODEL, progress=lambda _line: None))
    per = len(tok.encode(SENTENCE * 10).ids) / 10  # repeated, a sentence runs into the next
    return SENTENCE * round(tokens / per) + "The last ship to pass was"


@functools.cache
def reference(text: str) -> tuple[int, str]:
    """The prompt's length in tokens and its greedy continuation in one process, the
    prompt run in the first stage's chunks as the swarm runs it."""
    path = pull(MODEL, progress=lambda _line: None)
    return len(load_tokenizer(path).encode(text).ids), greedy_text(path, text, TOKENS)


async def seen(sent: Counter[str], msg: Msg) -> None:
    sent[msg.subject] += 1


@pytest.mark.parametrize("dispatch", ["hop", "chain"])
async def test_a_long_prompt_answers_the_single_process_text_and_its_chunks_go_as_they_should(
    processes: Processes, client: Client, tmp_path: Path, dispatch: str
) -> None:
    start(processes, tmp_path, ["a", "b", "c"], pipelines=1, dispatch=dispatch)
    await ready(client)
    failovers = await client.subscribe("hecate.events.failover")
    for length in LENGTHS:
        text = prompt(length)
        tokens, expected = reference(text)
        assert abs(tokens - length) < 0.02 * length
        sent: Counter[str] = Counter()  # what each node was sent, seen on the bus
        runs = await client.subscribe(subjects.node_run("*"), cb=functools.partial(seen, sent))
        request = InferRequest(prompt=text, max_tokens=TOKENS)
        msg = await client.request(subjects.infer(MODEL), msgspec.json.encode(request), timeout=300)
        reply = msgspec.json.decode(msg.data, type=InferReply)
        assert reply.ok, (length, reply.error)
        assert reply.output == expected, length
        assert reply.attempts == 1
        await settled(client)
        await runs.unsubscribe()
        assert reply.route is not None
        first, second = (subjects.node_run(s.node_id) for s in reply.route.stages[:2])
        chunks, decode_steps = math.ceil(tokens / PREFILL_CHUNK), TOKENS - 1
        # Every stage runs the prompt chunk by chunk. Hop by hop the router sends each
        # chunk to each stage; down a chain the first stage is sent the prompt once and
        # runs its chunks ahead, forwarding each as soon as it is run.
        assert sent[second] == chunks + decode_steps
        assert sent[first] == (1 if dispatch == "chain" else chunks) + decode_steps
    await settled(client)
    assert failovers.pending_msgs == 0
    for n in ("a", "b", "c"):  # what each node's engine computed, in its STATS
        data = endpoint_data(await stats(client, "node", n), "run")
        assert data is not None
        engine = data["engine"]
        assert engine["runs"] > 0
        assert engine["rows_computed"] >= engine["rows"] > 0


async def test_a_middle_stage_killed_while_the_first_runs_ahead_is_replayed_and_unchanged(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    """Down a chain, the middle stage is killed once it has been sent two of a long
    prompt's chunks run ahead (each marked ``more``), while the prompt's chunks are
    still in flight: the generation is replayed on the replica and answers the
    single-process text, and every surviving node, the lost route's first stage too,
    drops the prompt's sessions."""
    nodes = ["a", "b", "c", "d", "e", "f"]
    start(processes, tmp_path, nodes, pipelines=2, dispatch="chain")
    await ready(client)
    text = prompt(LENGTHS[0])
    _tokens, expected = reference(text)
    middle: list[str] = []  # the middle stage's node, once per chunk it is sent

    async def on_stage(msg: Msg) -> None:
        stage = msgspec.msgpack.decode(msg.data)
        if stage["layer_start"] == 10 and stage.get("more"):
            middle.append(msg.subject.split(".")[2])

    events: list[FailoverEvent] = []

    async def on_failover(msg: Msg) -> None:
        events.append(msgspec.json.decode(msg.data, type=FailoverEvent))

    await client.subscribe(subjects.node_run("*"), cb=on_stage)
    await client.subscribe(subjects.EVENT_FAILOVER, cb=on_failover)
    await settled(client)
    request = InferRequest(prompt=text, max_tokens=TOKENS)
    task = asyncio.create_task(
        client.request(subjects.infer(MODEL), msgspec.json.encode(request), timeout=300)
    )
    while len(middle) < 2 and not task.done():
        await asyncio.sleep(0.002)  # polling what the bus has carried so far
    assert len(middle) >= 2, "the prompt ran before two chunks reached the middle stage"
    victim = middle[0]
    processes.kill(f"node-{victim}", signal.SIGKILL)
    reply = msgspec.json.decode((await task).data, type=InferReply)
    assert reply.ok, reply.error
    assert reply.output == expected
    assert reply.route is not None
    assert victim not in [s.node_id for s in reply.route.stages]
    assert any(e.lost_node == victim and e.kind == "replica" for e in events), events
    held: dict[str, object] = {}

    async def released() -> bool:
        for n in (n for n in nodes if n != victim):
            data = endpoint_data(await stats(client, "node", n), "run")
            held[n] = data and data["sessions"]
        return all(v == 0 for v in held.values())

    await until(released, "every surviving node dropped the prompt's sessions", last=held)
