"""A generation ends cleanly: its reply counts its tokens and says why it ended, and its
caches leave the nodes with it. A caller that gives up (``hecate.router.cancel``) stops
the token loop at once and the nodes drop the session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus.streamed import request_streamed
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate.wire import subjects
from hecate.wire.messages import InferCancel, InferReply, InferRequest, StreamToken
from tests.support.swarm import Processes
from tests.support.waits import endpoint_data, router_status, stats, until
from tests.system.test_swarm_generation import MODEL, ask, ready, start

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

NODES = ("a", "b", "c")
PROMPT = "Once upon a time, in a small village,"


async def sessions_held(client: Client) -> dict[str, int | None]:
    held: dict[str, int | None] = {}
    for n in NODES:
        data = endpoint_data(await stats(client, "node", n), "run")
        held[n] = None if data is None else int(data["sessions"])
    return held


async def no_sessions_left(client: Client) -> None:
    seen: dict[str, int | None] = {}

    async def empty() -> bool:
        seen.update(await sessions_held(client))
        return all(v == 0 for v in seen.values())

    await until(empty, "every node dropped its sessions", last=seen)


async def test_replies_count_tokens_and_cancel_stops_the_generation_and_frees_the_caches(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    start(processes, tmp_path, list(NODES), pipelines=1, dispatch="chain")
    await ready(client)
    prompt_ids = load_tokenizer(pull(MODEL, progress=lambda _l: None)).encode(PROMPT).ids

    full = await ask(client, InferRequest(prompt=PROMPT, max_tokens=5))
    assert full.ok, full.error
    assert (full.prompt_tokens, full.completion_tokens, full.finish_reason) == (
        len(prompt_ids),
        5,
        "length",
    )
    stopped = await ask(
        client, InferRequest(prompt="The capital of France is", max_tokens=8, stop=["."])
    )
    assert (stopped.output, stopped.finish_reason) == (" Paris", "stop")
    await no_sessions_left(client)  # answered generations leave no cache behind

    # A long generation, cancelled after its third token.
    tokens: list[StreamToken] = []
    third = asyncio.Event()

    async def on_token(msg: Msg) -> None:
        tokens.append(msgspec.json.decode(msg.data, type=StreamToken))
        if len(tokens) == 3:
            third.set()

    request = InferRequest(prompt=PROMPT, max_tokens=400, request_id="gone-1")
    answer = asyncio.ensure_future(
        request_streamed(
            client,
            subjects.stream(MODEL),
            msgspec.json.encode(request),
            timeout=120,
            on_token=on_token,
        )
    )
    await asyncio.wait_for(third.wait(), 60)
    await client.publish(
        subjects.ROUTER_CANCEL, msgspec.json.encode(InferCancel(request_id="gone-1"))
    )
    reply = msgspec.json.decode((await answer).data, type=InferReply)
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code == "cancelled"
    # The step in flight when the cancel came may still have produced a token; nothing
    # after it. The reply carries the text so far, and every token streamed is in it.
    assert reply.completion_tokens in (3, 4), reply.completion_tokens
    await until(lambda: len(tokens) == reply.completion_tokens, "the streamed tokens")
    assert reply.output == "".join(t.text for t in tokens)
    await no_sessions_left(client)
    status = await router_status(client, "router-1")
    assert status is not None
    assert status["counters"]["cancelled"] == 1
