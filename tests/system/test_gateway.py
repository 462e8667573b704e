"""The HTTP gateway against a real swarm, driven by the official ``openai`` client.

One swarm for the module (nats-server, telemetry, planner, breaker with quotas, a router
enforcing them, a toy node that accepts faults) and one ``hecate gateway`` process with a
keys file made by ``hecate keys add``. Answers are compared with what a direct NATS
request returns; the 429 test watches the client retry by itself on its booked slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import msgspec
import nats
import openai
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hecate.bus.server import NatsServer
from hecate.wire import subjects
from hecate.wire.messages import InferCancel, InferReply, InferRequest, NodeFault
from hecate_gateway.app import Gateway, build_app
from hecate_gateway.bridge import Bridge
from hecate_gateway.keys import OpenAccess
from hecate_gateway.metrics import Metrics
from hecate_gateway.openai import Kind, parse
from hecate_gateway.swarm import SwarmWatch
from tests.support.gateways import gateway_port
from tests.support.swarm import EXAMPLES, Processes, hecate_argv, start_swarm
from tests.support.waits import GENEROUS_S, router_status, until

MODEL = "ncm-base"
# Tenant "slow": one request every 2 s, none in reserve. A request right after another
# is refused with a slot ~2 s away, which the client's own retry then claims.
SLOW_PER_MIN = 30


@dataclass
class Swarm:
    url: str  # NATS
    base: str  # the gateway, http://127.0.0.1:PORT
    keys: dict[str, str]  # tenant -> API key
    procs: Processes


def api_key(path: Path, tenant: str) -> str:
    out = subprocess.run(
        [*hecate_argv(), "keys", "add", tenant, "--file", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    tmp = tmp_path_factory.mktemp("gateway")
    server = NatsServer(tmp / "nats").start()
    procs = Processes(url=server.url, logs=tmp)
    try:
        quotas = tmp / "quotas.json"
        quotas.write_text(
            json.dumps({"tenants": {"slow": {"requests_per_min": SLOW_PER_MIN, "burst": 1}}})
        )
        procs.start("breaker", "breaker", "--id", "breaker", "--quotas", str(quotas))
        # ncm-base on gpu, and the reserve ncm-mini on edge for degraded answers.
        topology = str(EXAMPLES / "degraded.json")
        start_swarm(procs, EXAMPLES / "degraded.json", [], routers=0, pipelines=1)
        procs.start(
            "router-1",
            "router",
            "--id",
            "router-1",
            "--topology",
            topology,
            "--enforce-quotas",
            "--stage-timeout-ms",
            "30000",  # the disconnect test holds a stage for seconds
            "--quota-timeout-ms",
            str(GENEROUS_S * 1000),
        )
        for node, layers in (("gpu", "12"), ("edge", "4")):
            procs.start(f"node-{node}", "node", "--id", node, "--capacity-layers", layers,
                        "--accept-faults")  # fmt: skip
        keyfile = tmp / "keys.json"
        keys = {t: api_key(keyfile, t) for t in ("alice", "slow")}
        procs.start(
            "gateway", "gateway", "--keys", str(keyfile), "--port", "0", "--timeout-s", "60"
        )
        base = f"http://127.0.0.1:{gateway_port(procs)}"
        deadline = time.monotonic() + GENEROUS_S
        while httpx.get(f"{base}/healthz/ready").status_code != 200:
            assert time.monotonic() < deadline, httpx.get(f"{base}/healthz/ready").text
            time.sleep(0.05)
        yield Swarm(server.url, base, keys, procs)
    finally:
        procs.stop_all()
        server.stop()


@pytest.fixture
async def nc(swarm: Swarm) -> AsyncIterator[Client]:
    conn = await nats.connect(swarm.url)
    yield conn
    await conn.close()


def client(swarm: Swarm, tenant: str = "alice", **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{swarm.base}/v1", api_key=swarm.keys[tenant], **options)


async def direct(nc: Client, request: InferRequest) -> InferReply:
    msg = await nc.request(subjects.infer(MODEL), msgspec.json.encode(request), timeout=10)
    return msgspec.json.decode(msg.data, type=InferReply)


def as_swarm_request(kind: Kind, body: dict[str, Any]) -> InferRequest:
    """The request the gateway sends for ``body`` (what a NATS client would send)."""
    return parse(kind, json.dumps(body).encode()).request


CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "the gateway"}]


async def test_answers_are_the_swarms_text_in_openais_shape(swarm: Swarm, nc: Client) -> None:
    async with client(swarm) as c:
        raw = await c.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=5,
        )
        chat = raw.parse()
        text = await c.completions.create(model=MODEL, prompt="hello", max_tokens=4)
    want = await direct(nc, as_swarm_request("chat", {"model": MODEL, "messages": CHAT,
                                                      "max_tokens": 5}))  # fmt: skip
    assert chat.choices[0].message.content == want.output
    assert chat.id.startswith("chatcmpl-")
    assert (chat.object, chat.model, chat.choices[0].finish_reason) == (
        "chat.completion",
        MODEL,
        want.finish_reason or "stop",
    )
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == (want.prompt_tokens or 0)
    assert chat.usage.completion_tokens == (want.completion_tokens or 0)
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    assert raw.headers["x-hecate-route"] == "gpu"
    assert "x-hecate-degraded" not in raw.headers
    assert raw.headers["x-request-id"] == chat.id.removeprefix("chatcmpl-")
    plain = await direct(nc, InferRequest(prompt="hello", max_tokens=4))
    assert text.choices[0].text == plain.output
    assert text.object == "text_completion"
    assert text.id.startswith("cmpl-")


async def test_streamed_deltas_add_up_to_the_swarms_text(swarm: Swarm, nc: Client) -> None:
    async with client(swarm) as c:
        stream = await c.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    want = await direct(nc, as_swarm_request("chat", {"model": MODEL, "messages": CHAT,
                                                      "max_tokens": 6}))  # fmt: skip
    assert len({(c.id, c.created) for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.output
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1
    assert finishing[0].model_extra == {"hecate": {"degraded": False, "route": "gpu"}}
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == (want.completion_tokens or 0)
    assert all(c.usage is None for c in chunks[:-1])


async def test_usage_counts_what_the_toy_model_read_and_wrote(swarm: Swarm) -> None:
    """The toy model's tokens are words: it writes one pseudo-word per token, and reads
    a prompt (a chat as the gateway renders it for a model that takes only a prompt) as
    its whitespace-separated words. Whole, streamed, chat or not, usage says so."""
    rendered = "user: the gateway\nassistant:"  # CHAT as the toy model reads it: 4 words
    async with client(swarm) as c:
        chat = await c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5)
        text = await c.completions.create(
            model=MODEL, prompt="count these four words", max_tokens=3
        )
        stream = await c.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    said = chat.choices[0].message.content or ""
    assert chat.usage is not None
    assert len(said.split()) == 5
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (
        len(rendered.split()),
        len(said.split()),
    )
    assert chat.usage.total_tokens == 9
    assert text.usage is not None
    assert len(text.choices[0].text.split()) == 3
    assert (text.usage.prompt_tokens, text.usage.completion_tokens, text.usage.total_tokens) == (
        4,
        3,
        7,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None
    assert len(streamed.split()) == 6
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (4, 6, 10)


async def test_sse_framing_byte_by_byte(swarm: Swarm, nc: Client) -> None:
    body = {"model": MODEL, "prompt": "bytes", "max_tokens": 3, "stream": True}
    headers = {"authorization": f"Bearer {swarm.keys['alice']}"}
    async with (
        httpx.AsyncClient(base_url=swarm.base) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        raw = b"".join([part async for part in r.aiter_raw()])
    want = await direct(nc, InferRequest(prompt="bytes", max_tokens=3))
    found = re.match(
        rb'data: \{"id":"(cmpl-[0-9a-f]{32})","object":"text_completion","created":(\d+),', raw
    )
    assert found is not None, raw
    rid, created = found.group(1).decode(), found.group(2).decode()
    head = f'"id":"{rid}","object":"text_completion","created":{created},"model":"{MODEL}"'
    expected = (
        f'data: {{{head},"choices":[{{"text":{json.dumps(want.output)},"index":0,'
        f'"logprobs":null,"finish_reason":null}}]}}\n\n'
        f'data: {{{head},"choices":[{{"text":"","index":0,"logprobs":null,'
        f'"finish_reason":"{want.finish_reason or "stop"}"}}],'
        f'"hecate":{{"degraded":false,"route":"gpu"}}}}\n\n'
        "data: [DONE]\n\n"
    )
    assert raw == expected.encode()


async def test_a_missing_or_unknown_key_is_a_401(swarm: Swarm) -> None:
    async with openai.AsyncOpenAI(base_url=f"{swarm.base}/v1", api_key="sk-hecate-nope") as c:
        with pytest.raises(openai.AuthenticationError) as caught:
            await c.chat.completions.create(model=MODEL, messages=CHAT)
    assert caught.value.code == "invalid_api_key"
    async with httpx.AsyncClient(base_url=swarm.base) as http:
        r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
        models = await http.get("/v1/models")
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert models.status_code == 401


async def test_an_unknown_model_is_a_404(swarm: Swarm) -> None:
    async with client(swarm) as c:
        for model in ("no-such-model", "gpt-4o"):
            with pytest.raises(openai.NotFoundError) as caught:
                await c.chat.completions.create(model=model, messages=CHAT)
            assert (caught.value.code, caught.value.param) == ("model_not_found", "model")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"tool_choice": "required"}, "tool_choice"),  # without tools
        ({"extra_body": {"frobnicate": True}}, "frobnicate"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
async def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    swarm: Swarm, fields: dict[str, Any], param: str
) -> None:
    async with client(swarm) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            await c.chat.completions.create(model=MODEL, messages=CHAT, **fields)
    assert caught.value.param == param
    assert caught.value.status_code == 400


async def test_bad_input_gets_an_openai_error_and_the_gateway_keeps_serving(swarm: Swarm) -> None:
    key = {"Authorization": f"Bearer {swarm.keys['alice']}"}
    async with httpx.AsyncClient(base_url=swarm.base, headers=key, timeout=30) as http:
        huge = await http.post("/v1/completions", content=b"{" + b" " * (2 * 1024 * 1024))

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(32):
                yield b"x" * 65536

        # No declared length (chunked): refused while it streams in.
        streamed = await http.post("/v1/completions", content=chunks())
        broken = await http.post("/v1/completions", content=b'{"model": ')
        nowhere = await http.get("/v1/no-such-endpoint")
        wrong_method = await http.get("/v1/completions")
        fine = await http.post("/v1/completions", json={"model": MODEL, "prompt": "still here"})
    for r, status in ((huge, 413), (streamed, 413), (broken, 400), (nowhere, 404)):
        assert r.status_code == status, r.text
        assert set(r.json()["error"]) >= {"message", "type", "code", "param"}
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert fine.status_code == 200, fine.text


async def test_a_refused_request_is_retried_by_the_client_on_its_booked_slot(
    swarm: Swarm, nc: Client
) -> None:
    """The quota desk refuses tenant "slow"'s second request with a slot of its own; the
    official client, with nothing but its defaults, waits retry-after-ms and sends the
    same body again, and the gateway presents that refusal's ticket for it."""
    seen: list[InferRequest] = []

    async def observe(msg: Msg) -> None:  # a copy of every request (routers use a queue)
        request = msgspec.json.decode(msg.data, type=InferRequest)
        if request.tenant == "slow":
            seen.append(request)

    sub = await nc.subscribe(subjects.infer(MODEL), cb=observe)
    statuses: list[tuple[int, str | None]] = []

    async def on_response(response: httpx2.Response) -> None:
        statuses.append((response.status_code, response.headers.get("retry-after-ms")))

    metrics_before = await scrape(swarm)
    http = openai.DefaultAsyncHttpxClient(event_hooks={"response": [on_response]})
    assert (await direct(nc, InferRequest(prompt="first", max_tokens=2, tenant="slow"))).ok
    async with client(swarm, "slow", http_client=http) as c:
        answer = await c.completions.create(model=MODEL, prompt="second", max_tokens=2)
    await sub.unsubscribe()
    assert answer.choices[0].text
    (refused, refused_ms), (served, _) = statuses
    assert (refused, served) == (429, 200), "one refusal, one retry: no retries of our own"
    assert refused_ms is not None
    assert 0 < int(refused_ms) <= 60_000 / SLOW_PER_MIN
    first, retry = seen[-2:]
    assert first.quota_ticket is None
    assert retry.quota_ticket is not None, "the retry claims the slot booked for it"
    assert retry.request_id != first.request_id
    metrics = await scrape(swarm)
    assert counted(metrics, "hecate_gateway_rate_limited_total") == 1 + counted(
        metrics_before, "hecate_gateway_rate_limited_total"
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_hangs_up_cancels_its_request_in_the_swarm(
    swarm: Swarm, nc: Client, stream: bool
) -> None:
    cancels: list[InferCancel] = []

    async def on_cancel(msg: Msg) -> None:
        cancels.append(msgspec.json.decode(msg.data, type=InferCancel))

    sub = await nc.subscribe(subjects.ROUTER_CANCEL, cb=on_cancel)
    requests: list[InferRequest] = []

    async def observe(msg: Msg) -> None:
        requests.append(msgspec.json.decode(msg.data, type=InferRequest))

    asked_on = subjects.stream(MODEL) if stream else subjects.infer(MODEL)
    seen = await nc.subscribe(asked_on, cb=observe)
    # Every step of the node now takes 2 s: the hang-up, milliseconds after the request
    # reaches the swarm, comes long before the answer. (The next test waits for the
    # node to finish that step: a toy node runs one step at a time.)
    await fault(nc, NodeFault(delay_ms=2_000))
    before = await scrape(swarm)
    try:
        async with httpx.AsyncClient(base_url=swarm.base, timeout=60) as http:
            body = {"model": MODEL, "messages": CHAT, "max_tokens": 4, "stream": stream}
            auth = {"authorization": f"Bearer {swarm.keys['alice']}"}
            asking = asyncio.create_task(http.post("/v1/chat/completions", json=body, headers=auth))
            await until(lambda: bool(requests), "the request reached the swarm")
            asking.cancel()  # the client gives up and closes its connection
            with pytest.raises(asyncio.CancelledError):
                await asking
        await until(lambda: bool(cancels), "the gateway told the routers")
    finally:
        await fault(nc, NodeFault())
        await sub.unsubscribe()
        await seen.unsubscribe()
    (cancel,) = cancels
    assert (cancel.request_id, cancel.tenant) == (requests[0].request_id, "alice")

    async def counted_499() -> bool:
        after = await scrape(swarm)
        return counted(after, "hecate_gateway_cancelled_total") == 1 + counted(
            before, "hecate_gateway_cancelled_total"
        )

    await until(counted_499, "the hang-up counted")

    async def router_stopped() -> bool:
        status = await router_status(nc, "router-1")
        return status is not None and status["counters"].get("cancelled", 0) >= 1

    await until(router_stopped, "the router answered the request cancelled")


async def test_a_model_that_does_not_sample_refuses_a_json_answer_by_name(swarm: Swarm) -> None:
    async with client(swarm) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            await c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                response_format={"type": "json_object"},
            )
    assert "cannot give its answer the shape 'json_object'" in str(caught.value)


async def test_models_probes_and_metrics(swarm: Swarm) -> None:
    async with client(swarm) as c:
        models = await c.models.list()
        one = await c.models.retrieve(MODEL)
    assert [m.id for m in models.data] == [MODEL, "ncm-mini"]  # the reserve can serve too
    assert (one.id, one.object, one.owned_by) == (MODEL, "model", "hecate")
    async with httpx.AsyncClient(base_url=swarm.base) as http:
        listed = (await http.get("/v1/models", headers=bearer(swarm))).json()
        live = await http.get("/healthz/live")
        ready = await http.get("/healthz/ready")
    assert listed["object"] == "list"
    assert set(listed["data"][0]) == {"id", "object", "created", "owned_by", "capabilities"}
    # The toy model computes no tokens: no shape, no log-probabilities.
    assert listed["data"][0]["capabilities"] == {
        "response_format": ["text"],
        "logprobs": False,
        "tools": False,
        "prefix_cache": False,
    }
    assert live.status_code == ready.status_code == 200
    assert ready.json() == {"ready": True, "missing": []}
    metrics = await scrape(swarm)
    for name in (
        "hecate_gateway_requests_total",
        "hecate_gateway_requests_in_flight",
        "hecate_gateway_time_to_first_token_seconds_bucket",
        "hecate_gateway_generated_tokens_total",
        "hecate_swarm_layer_min_live_replicas",  # the swarm watch's gauges, same registry
    ):
        assert name in metrics, name
    assert (
        counted(
            metrics, 'hecate_gateway_requests_total{endpoint="chat",model="ncm-base",status="200"}'
        )
        >= 1
    )
    assert (
        counted(metrics, 'hecate_gateway_requests_total{endpoint="chat",model="",status="401"}')
        >= 1
    )


async def test_trace_context_goes_to_the_swarm_with_each_request(nc: Client) -> None:
    """The HTTP request's span is the parent of what the router does: its trace context
    is in the NATS request's headers."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    headers: list[dict[str, str]] = []

    async def observe(msg: Msg) -> None:
        headers.append(dict(msg.headers or {}))

    sub = await nc.subscribe(subjects.infer(MODEL), cb=observe)
    async with in_process(nc, tracer_provider=provider) as http:
        body = {"model": MODEL, "prompt": "t", "max_tokens": 1}
        r = await http.post("/v1/completions", json=body)
    await sub.unsubscribe()
    assert r.status_code == 200
    (span,) = exporter.get_finished_spans()
    assert span.name == "POST /v1/completions"
    trace_id = format(span.context.trace_id, "032x")
    assert headers[-1]["traceparent"].split("-")[1] == trace_id


def in_process(nc: Client, *, timeout_s: float = 60.0, **options: Any) -> httpx.AsyncClient:
    """The gateway app on this test's NATS connection, called in process (no socket),
    with a swarm watch that is not running: it has seen no plan."""
    app = build_app(
        Gateway(
            bridge=Bridge(nc, timeout_s=timeout_s),
            auth=OpenAccess(),
            watch=SwarmWatch(),
            metrics=Metrics(),
            log=logging.getLogger("hecate.test"),
            **options,
        )
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")


async def test_readiness_says_what_is_missing(nc: Client) -> None:
    async with in_process(nc) as http:
        live = await http.get("/healthz/live")
        ready = await http.get("/healthz/ready")
    assert live.status_code == 200
    assert ready.status_code == 503
    assert ready.json() == {"ready": False, "missing": ["plan: none published yet"]}


async def test_no_answer_in_time_is_a_504_and_the_swarm_is_told_to_stop(nc: Client) -> None:
    cancels: list[InferCancel] = []

    async def on_cancel(msg: Msg) -> None:
        cancels.append(msgspec.json.decode(msg.data, type=InferCancel))

    sub = await nc.subscribe(subjects.ROUTER_CANCEL, cb=on_cancel)
    await fault(nc, NodeFault(delay_ms=1_000))  # far past the gateway's 0.1 s below
    try:
        async with in_process(nc, timeout_s=0.1) as http:
            body = {"model": MODEL, "prompt": "late", "max_tokens": 1}
            r = await http.post("/v1/completions", json=body)
        await until(lambda: bool(cancels), "the gateway told the routers")
    finally:
        await fault(nc, NodeFault())
        await sub.unsubscribe()
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "timeout"
    assert cancels[0].request_id == r.headers["x-request-id"]


async def test_a_degraded_answer_says_so_and_names_its_route(swarm: Swarm, nc: Client) -> None:
    """The base model's only node fails every step: the router answers from the reserve
    model, and the client is told, in headers and in the stream's finishing chunk."""
    await fault(nc, NodeFault(error="internal"))
    try:
        async with client(swarm) as c:
            raw = await c.chat.completions.with_raw_response.create(
                model=MODEL, messages=CHAT, max_tokens=2
            )
            stream = await c.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=2, stream=True
            )
            chunks = [chunk async for chunk in stream]
    finally:
        await fault(nc, NodeFault())
    assert raw.headers["x-hecate-degraded"] == "true"
    assert raw.headers["x-hecate-route"] == "edge"
    assert raw.parse().choices[0].message.content
    (finishing,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing.model_extra == {"hecate": {"degraded": True, "route": "edge"}}
    metrics = await scrape(swarm)
    assert counted(metrics, "hecate_gateway_degraded_answers_total") >= 2


async def test_nothing_to_serve_is_a_503(swarm: Swarm, nc: Client) -> None:
    """Last in the module: every node fails; it leaves their circuits open."""
    for node in ("gpu", "edge"):
        await fault(nc, NodeFault(error="internal"), node)
    try:
        async with client(swarm, max_retries=0) as c:
            with pytest.raises(openai.InternalServerError) as caught:
                await c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    finally:
        for node in ("gpu", "edge"):
            await fault(nc, NodeFault(), node)
    assert caught.value.status_code == 503
    assert caught.value.type == "server_error"


# -- helpers -----------------------------------------------------------------------------


def bearer(swarm: Swarm) -> dict[str, str]:
    return {"authorization": f"Bearer {swarm.keys['alice']}"}


async def fault(nc: Client, f: NodeFault, node: str = "gpu") -> None:
    await nc.request(subjects.node_fault(node), msgspec.json.encode(f), timeout=5)


async def scrape(swarm: Swarm) -> str:
    async with httpx.AsyncClient(base_url=swarm.base) as http:
        return (await http.get("/metrics")).text


def counted(metrics: str, sample: str) -> float:
    """A sample's value (``name{labels}``), or the sum over every label set (``name``)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(sample) and line[len(sample)] in " {"
    )
