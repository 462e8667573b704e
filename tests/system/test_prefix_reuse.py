"""Prompt prefixes reused across requests on SmolLM2's three stages, hop by hop and
chained: a chat's next turn starts from the cached positions of the last one on every
stage, answers exactly what the same prompt answers computed whole, and another tenant
sending the very same messages is never served from the first tenant's cache."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import msgspec
import nats
import openai
import pytest
from nats.aio.client import Client
from openai.types.chat import ChatCompletionMessageParam

from hecate.core import SwarmPlan
from hecate.llm.store import pull
from hecate.wire import subjects
from hecate.wire.common import ChatMessage
from hecate.wire.messages import InferReply, InferRequest
from hecate_gateway.openai import parse
from hecate_launcher import hecate_command
from tests.support.swarm import Processes, infer_when_up
from tests.support.waits import endpoint_data, stats
from tests.system.test_swarm_generation import ask, ready, start

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

NODES = ("a", "b", "c")
SYSTEM = (
    "You are the help desk of a small public library. Answer in one sentence, say on "
    "which floor the book is kept, and never make up a title. "
) * 4


def turn(tenant: str, *questions: str) -> InferRequest:
    messages = [ChatMessage(role="system", content=SYSTEM)]
    for q in questions:
        messages.append(ChatMessage(role="user", content=q))
    return InferRequest(prompt="", messages=messages, max_tokens=8, tenant=tenant)


async def prefixes(client: Client) -> dict[str, dict[str, Any]]:
    out = {}
    for n in NODES:
        data = endpoint_data(await stats(client, "node", n), "run")
        assert data is not None
        out[n] = data["prefixes"]
    return out


@pytest.mark.parametrize("dispatch", ["hop", "chain"])
async def test_a_tenants_next_turn_reuses_its_prefix_on_every_stage_and_nobody_elses(
    processes: Processes, client: Client, tmp_path: Path, dispatch: str
) -> None:
    start(processes, tmp_path, list(NODES), pipelines=1, dispatch=dispatch)
    await ready(client)
    # Bob's second turn, computed whole (nothing of his is cached): the reference.
    cold = await ask(client, turn("bob", "Where is Moby Dick?", "And Emma?"))
    assert cold.ok, cold.error
    before = await prefixes(client)
    first = await ask(client, turn("alice", "Where is Moby Dick?"))
    assert first.ok, first.error
    warm = await ask(client, turn("alice", "Where is Moby Dick?", "And Emma?"))
    assert warm.ok, warm.error
    after = await prefixes(client)
    assert after["a"]["hits"] == before["a"]["hits"] + 1  # Alice's second turn
    reused = after["a"]["reused_positions"] - before["a"]["reused_positions"]
    assert reused >= 64  # the system prompt at least
    # Every later stage took the same positions from its own cache.
    for n in ("b", "c"):
        assert after[n]["reused_positions"] - before[n]["reused_positions"] == reused
    assert warm.output == cold.output  # bit-equal numbers: the same greedy text
    # Each answer says where its router sent it as to a prefix kept.
    assert (cold.prefix, first.prefix, warm.prefix) == ("none", "none", "toward")
    assert warm.prompt_tokens == cold.prompt_tokens
    # Bob again, the very same messages Alice cached: none of hers is his.
    again = await ask(client, turn("carol", "Where is Moby Dick?", "And Emma?"))
    final = await prefixes(client)
    assert again.ok, again.error
    assert again.output == cold.output
    assert final["a"]["hits"] == after["a"]["hits"]
    assert final["a"]["misses"] == after["a"]["misses"] + 1


def test_on_make_runs_swarm_a_next_turn_sent_at_once_finds_its_prefix_whichever_router_takes_it(
    tmp_path: Path,
) -> None:
    """``hecate up`` as ``make run`` starts it (two routers, two pipelines): sixteen
    chats through the gateway (a ~450-word system prompt each), each next turn sent as
    soon as the previous answer ends. The nodes tell every router what their first
    stages keep, so whichever router takes a next turn sends it where its prefix is:
    at least 15 of 16 start from it (the first nodes' own count of sessions started
    from a cached prefix), and each answers what the same turn computed whole does.
    (Before, each router knew only where it had sent prompts itself: with one router 0
    of 8 went there, the nodes' load figures still carrying the answer just given; with
    two, 4 of 8.)"""
    pull("smollm2-135m", progress=lambda _line: None)
    state = tmp_path / "state"
    argv = ["up", "--topology", str(EXAMPLES / "smollm2.json")]
    up = subprocess.Popen(
        [*hecate_command(), *argv, "--state", str(state), "--gateway", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = infer_when_up(state, MODEL, "Hi", "--max-tokens", "1", within=120, poll_s=0.5)
        assert ready.returncode == 0, ready.stderr
        base = (state / "gateway.url").read_text().strip()
        url = (state / "nats.url").read_text().strip()
        api = openai.OpenAI(
            base_url=f"{base}/v1", api_key=(state / "gateway.key").read_text().strip()
        )
        before, hits = routed(base), asyncio.run(first_hits(url))
        nexts = []
        for i in range(CHATS):
            messages: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": f"Chat {i}. {BOOKS}"},
                {"role": "user", "content": "Where are the rare books?"},
            ]
            answer = streamed(api, messages)
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "And who may borrow them?"},
            ]
            nexts.append((messages, streamed(api, messages)))
        reused = asyncio.run(first_hits(url)) - hits
        after = routed(base)
        went = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert reused >= CHATS - 1, (reused, went)
        assert went.get("toward", 0) >= CHATS - 1, went
        for i, (messages, text) in enumerate(nexts):  # another tenant's: computed whole
            assert text == asyncio.run(whole(url, messages, f"ref-{i}")), i
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=90)
    assert up.returncode == 0, out[-2000:]


CHATS = 16


async def first_hits(url: str) -> int:
    """Sessions the swarm's first stages started from a cached prefix (their STATS)."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.PLAN_BUCKET)
        plan = msgspec.json.decode((await kv.get(subjects.PLAN_KEY)).value or b"", type=SwarmPlan)
        total = 0
        for node_id in {p.stages[0].node_id for p in plan.pipelines}:
            data = endpoint_data(await stats(nc, "node", node_id), "run")
            assert data is not None
            total += int(data["prefixes"]["hits"])
        return total
    finally:
        await nc.close()


MODEL = "smollm2-135m"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BOOKS = "The library keeps its rare books on the third floor and lends them to members. " * 30


def streamed(api: openai.OpenAI, messages: list[ChatCompletionMessageParam]) -> str:
    stream = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def routed(base: str) -> dict[str, float]:
    """The gateway's turns by where the router sent them as to a kept prefix."""
    text = httpx.get(f"{base}/metrics").text
    pattern = r'hecate_gateway_prefix_routed_total\{model="[^"]+",outcome="(\w+)"\} (\S+)'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text)}


async def whole(url: str, messages: list[ChatCompletionMessageParam], tenant: str) -> str:
    """The text the gateway's request for ``messages`` gets as ``tenant``'s."""
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 8}).encode()
    request = msgspec.structs.replace(parse("chat", body).request, tenant=tenant)
    nc = await nats.connect(url)
    try:
        msg = await nc.request(subjects.infer(MODEL), msgspec.json.encode(request), timeout=60)
    finally:
        await nc.close()
    reply = msgspec.json.decode(msg.data, type=InferReply)
    assert reply.ok, reply.error
    return reply.output or ""
