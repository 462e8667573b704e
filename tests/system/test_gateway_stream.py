"""SmolLM2 streamed through the HTTP gateway to the official ``openai`` client: token by
token, the same text and counts as a direct NATS request, stop strings never leaking,
and a client that hangs up mid-stream has the swarm told to stop.

One node holds all 30 layers (one process to load); generations are a few tokens."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import msgspec
import nats
import openai
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from openai.types.chat import ChatCompletionMessageParam

from hecate.wire import subjects
from hecate.wire.messages import InferCancel, InferReply
from hecate_gateway.openai import parse
from tests.support.gateways import llm_gateway
from tests.support.waits import router_status, until
from tests.system.test_gateway import counted

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

MODEL = "smollm2-135m"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(NATS url, gateway base URL) of a one-node SmolLM2 swarm behind a gateway."""
    with llm_gateway(tmp_path_factory.mktemp("gateway-llm"), MODEL) as urls:
        yield urls


@pytest.fixture
async def nc(gateway: tuple[str, str]) -> AsyncIterator[Client]:
    conn = await nats.connect(gateway[0])
    yield conn
    await conn.close()


def client(gateway: tuple[str, str]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway[1]}/v1", api_key="unused")


async def direct(nc: Client, body: dict[str, Any]) -> InferReply:
    """What a NATS client gets for the request the gateway makes of ``body``."""
    request = parse("chat", json.dumps({"model": MODEL, **body}).encode()).request
    msg = await nc.request(subjects.infer(MODEL), msgspec.json.encode(request), timeout=60)
    return msgspec.json.decode(msg.data, type=InferReply)


async def test_tokens_stream_as_they_come_and_add_up_to_the_swarms_answer(
    gateway: tuple[str, str], nc: Client
) -> None:
    async with client(gateway) as c:
        stream = await c.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    want = await direct(nc, {"messages": QUESTION, "max_tokens": 8})
    assert want.ok, want.error
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(deltas) > 1, "streamed token by token, not in one piece"
    assert "".join(deltas) == want.output
    (finishing,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing.choices[0].finish_reason == (want.finish_reason or "stop")
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        want.prompt_tokens,
        want.completion_tokens,
    )
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens >= len(deltas)


async def test_a_stop_string_across_tokens_never_reaches_the_client(
    gateway: tuple[str, str], nc: Client
) -> None:
    """A stop string that begins in one token and ends in a later one: its start was
    already generated when the stop was seen; the gateway held it back."""
    plain = await direct(nc, {"messages": QUESTION, "max_tokens": 8})
    text = plain.output or ""
    assert len(text) > 6
    stop = text[3:7]  # 4 characters into the text: more than one token, most likely
    async with client(gateway) as c:
        stream = await c.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=8, stream=True, stop=[stop]
        )
        streamed = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    want = await direct(nc, {"messages": QUESTION, "max_tokens": 8, "stop": [stop]})
    assert streamed == want.output == text[: text.find(stop)]


async def test_hanging_up_mid_stream_tells_the_swarm_to_stop(
    gateway: tuple[str, str], nc: Client
) -> None:
    cancels: list[InferCancel] = []

    async def on_cancel(msg: Msg) -> None:
        cancels.append(msgspec.json.decode(msg.data, type=InferCancel))

    sub = await nc.subscribe(subjects.ROUTER_CANCEL, cb=on_cancel)
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 200, "stream": True}
    async with (
        httpx.AsyncClient(base_url=gateway[1], timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        request_id = r.headers["x-request-id"]
        async for line in r.aiter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # a first token came: hang up in the middle of the generation
    await until(lambda: bool(cancels), "the gateway told the routers")
    await sub.unsubscribe()
    assert [(c.request_id, c.tenant) for c in cancels] == [(request_id, "default")]

    async def hang_up_counted() -> bool:
        async with httpx.AsyncClient(base_url=gateway[1]) as http:
            metrics = (await http.get("/metrics")).text
        return counted(metrics, "hecate_gateway_cancelled_total") >= 1

    await until(hang_up_counted, "the hang-up counted")

    async def router_stopped() -> bool:
        status = await router_status(nc, "router-1")
        return status is not None and status["counters"].get("cancelled", 0) >= 1

    await until(router_stopped, "the router stopped the generation")


OUTCOMES = ("none", "toward", "elsewhere")


async def test_a_chats_next_turn_is_counted_routed_toward_its_kept_prefix(
    gateway: tuple[str, str],
) -> None:
    """The gateway's metrics say where the router sent each turn as to a prefix it knew
    kept: a chat's first turn to none known, its next toward the pipeline keeping it."""

    async def outcomes() -> dict[str, float]:
        async with httpx.AsyncClient(base_url=gateway[1]) as http:
            metrics = (await http.get("/metrics")).text
        name = "hecate_gateway_prefix_routed_total"
        return {o: counted(metrics, f'{name}{{model="{MODEL}",outcome="{o}"}}') for o in OUTCOMES}

    before = await outcomes()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You keep the catalogue of a small library. " * 8},
        {"role": "user", "content": "Where is Moby Dick kept?"},
    ]
    api = client(gateway)
    first = await api.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And Emma?"},
    ]
    await api.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    after = await outcomes()
    assert {o: after[o] - before[o] for o in OUTCOMES} == {
        "none": 1,
        "toward": 1,
        "elsewhere": 0,
    }
