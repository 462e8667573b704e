"""The streaming part of ``hecate bench gateway``: the inter-token latency the gateway
adds when it streams SmolLM2, on ``make run``'s swarm (two 3-stage pipelines, two
routers; :mod:`hecate_dev.bench.gateway`'s :func:`standing`, with the gateway beside it).

Each token is timed twice, in this process, on one clock: when the router's
``StreamToken`` for it is published to the gateway's reply inbox (an observer
connection subscribed to ``_INBOX.>`` on the open bus sees the same message the gateway
does, at the same moment), and when its SSE chunk reaches the HTTP client. Two clients,
as for the toy model's latency: the minimal HTTP/1.1 client (the figure the target
judges) and httpx, streaming, as the ``openai`` SDK reads it. The gateway generates the
request id; its answer says it in ``x-request-id``, which picks the observed tokens of
that request. The k-th chunk with text is the k-th token with text (no stop string is
set, so nothing is held back); a pair whose texts differ ends the pairing, and what is
left is counted as unmatched.

Streams run one at a time, direct (NATS, streamed on an inbox of its own) and through the
gateway with each client, taking turns (the order rotated) for ``rounds`` rounds, the
same prompt and ``max_tokens``: tokens/s of each (the tokens after the first, over the
time after the first) and the text check (every stream's text and every direct reply
are the first direct reply's text).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus.streamed import request_streamed
from hecate.wire import subjects
from hecate.wire.messages import InferReply, StreamToken
from hecate_dev.bench.gateway_load import TENANT, Http1, completion_body
from hecate_dev.bench.gateway_swarm import Standing, bench_env, standing, wait_serving
from hecate_dev.bench.generators import run_on_uvloop
from hecate_dev.bench.openloop import percentile
from hecate_gateway.openai import parse

MODEL = "smollm2-135m"
TOPOLOGY = "smollm2.json"  # make run's (examples/smollm2.json, packaged with the chaos kit)
PROMPT = "The capital of France is"
STREAM_TIMEOUT_S = 300.0

Stamped = tuple[float, str]  # when, text


def matched(tokens: dict[int, Stamped], chunks: Sequence[Stamped]) -> tuple[list[float], int]:
    """Per token, its chunk's arrival minus the token's publication (seconds), pairing
    the tokens with text in index order with the chunks in arrival order; and how many
    tokens or chunks found no pair (texts that differ end the pairing)."""
    spoken = [tokens[i] for i in sorted(tokens) if tokens[i][1]]
    added: list[float] = []
    for (at, text), (seen, sent) in zip(spoken, chunks, strict=False):
        if text != sent:
            break
        added.append(seen - at)
    return added, len(spoken) + len(chunks) - 2 * len(added)


def tokens_per_s(stamps: Sequence[float]) -> float:
    """Tokens after the first, over the time after the first."""
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return 0.0
    return round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 2)


class Observer:
    """Every ``StreamToken`` on ``_INBOX.>``, stamped as it arrives, by request id."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[int, Stamped]] = {}
        self._decode = msgspec.json.Decoder(StreamToken).decode

    async def on_message(self, msg: Msg) -> None:
        at = time.perf_counter()
        try:
            token = self._decode(msg.data)
        except msgspec.DecodeError:
            return  # a reply, not a token
        self.seen.setdefault(token.request_id, {})[token.index] = (at, token.text)


async def _direct(nc: Client, tokens: int) -> tuple[list[float], str, str]:
    """One direct stream: its tokens' arrival times, the streamed text, the reply text."""
    request = parse("completion", completion_body(MODEL, PROMPT, tokens)).request
    request = msgspec.structs.replace(request, tenant=TENANT, request_id=uuid.uuid4().hex)
    got: list[tuple[float, StreamToken]] = []

    async def on_token(msg: Msg) -> None:
        got.append((time.perf_counter(), msgspec.json.decode(msg.data, type=StreamToken)))

    msg = await request_streamed(
        nc,
        subjects.stream(MODEL),
        msgspec.json.encode(request),
        timeout=STREAM_TIMEOUT_S,
        on_token=on_token,
    )
    reply = msgspec.json.decode(msg.data, type=InferReply)
    if not reply.ok:
        raise RuntimeError(f"a direct stream failed: {reply.error}")
    got.sort(key=lambda g: g[1].index)
    return [t for t, _ in got], "".join(g.text for _, g in got), reply.output or ""


class SseText:
    """The text deltas of a streamed ``/v1/completions`` answer, out of its bytes as
    they come (frames may be split across reads, or several in one)."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, piece: bytes) -> list[str]:
        self.buffer += piece
        *frames, self.buffer = self.buffer.split(b"\n\n")
        texts = []
        for frame in frames:
            data = frame.removeprefix(b"data: ")
            if data == b"[DONE]":
                continue
            chunk = msgspec.json.decode(data)
            if "error" in chunk:
                raise RuntimeError(f"the stream broke: {chunk['error']}")
            text = chunk["choices"][0]["text"] if chunk.get("choices") else ""
            if text:
                texts.append(text)
        return texts


Streamed = tuple[str, list[Stamped]]  # request id, text chunks as they reached the client
BODY_HEADERS = {"content-type": "application/json"}


async def _through_minimal(base: str, tokens: int) -> Streamed:
    """One stream through the gateway, read by the minimal HTTP/1.1 client."""
    conn = await Http1.open(base)  # a new one: a keep-alive one may have idled out
    sse = SseText()
    chunks: list[Stamped] = []
    try:
        body = completion_body(MODEL, PROMPT, tokens, stream=True)
        status, headers = await conn.stream(Http1.post_bytes(base, "/v1/completions", body))
        if status != 200 or headers.get("transfer-encoding") != "chunked":
            raise RuntimeError(f"the gateway answered {status} {headers}")
        async for piece in conn.chunks():
            at = time.perf_counter()
            chunks += [(at, text) for text in sse.feed(piece)]
    finally:
        await conn.close()
    return headers["x-request-id"], chunks


async def _through_httpx(hx: httpx.AsyncClient, tokens: int) -> Streamed:
    """One stream through the gateway, read by httpx as the ``openai`` SDK reads it."""
    body = completion_body(MODEL, PROMPT, tokens, stream=True)
    sse = SseText()
    chunks: list[Stamped] = []
    async with hx.stream("POST", "/v1/completions", content=body, headers=BODY_HEADERS) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the gateway answered {r.status_code}: {await r.aread()!r}")
        async for piece in r.aiter_raw():
            at = time.perf_counter()
            chunks += [(at, text) for text in sse.feed(piece)]
    return r.headers["x-request-id"], chunks


def _added(added: list[float]) -> dict[str, float]:
    ordered = sorted(added)
    return {
        "p50": round(percentile(ordered, 0.50) * 1e6, 1),
        "p99": round(percentile(ordered, 0.99) * 1e6, 1),
        "max": round(ordered[-1] * 1e6, 1) if ordered else 0.0,
        "samples": len(ordered),
    }


async def _measure(st: Standing, tokens: int, rounds: int) -> dict[str, Any]:
    observer = Observer()
    watch = await nats.connect(st.url)
    nc = await nats.connect(st.url)
    await watch.subscribe("_INBOX.>", cb=observer.on_message)
    await watch.flush()
    clients = ("gateway", "gateway_httpx")
    added: dict[str, list[float]] = {c: [] for c in clients}
    tps: dict[str, list[float]] = {c: [] for c in ("direct", *clients)}
    unmatched = 0
    texts: list[str] = []
    expected: str | None = None  # the first direct reply's: every text must be it
    try:
        async with httpx.AsyncClient(base_url=st.base, timeout=STREAM_TIMEOUT_S) as hx:

            async def through(client: str, n: int) -> Streamed:
                if client == "gateway":
                    return await _through_minimal(st.base, n)
                return await _through_httpx(hx, n)

            await _direct(nc, 2)  # every path warm
            for client in clients:
                await through(client, 2)
            for r in range(rounds):
                order = ("direct", *clients)
                turn = r % len(order)
                for path in order[turn:] + order[:turn]:  # the order rotated
                    if path == "direct":
                        stamps, streamed, output = await _direct(nc, tokens)
                        tps[path].append(tokens_per_s(stamps))
                        texts += [output, streamed]
                        expected = expected if expected is not None else output
                        continue
                    request_id, chunks = await through(path, tokens)
                    await watch.flush()  # every token the observer will see, seen
                    pairs, missed = matched(observer.seen.pop(request_id, {}), chunks)
                    added[path] += pairs
                    unmatched += missed
                    tps[path].append(tokens_per_s([at for at, _ in chunks]))
                    texts.append("".join(text for _, text in chunks))
    finally:
        await nc.close()
        await watch.close()
    wrong = sum(t != expected for t in texts)
    return {
        "added_us": _added(added["gateway"]),
        "added_us_httpx": _added(added["gateway_httpx"]),
        "unmatched": unmatched,
        **{f"{path}_tokens_per_s": _median(v) for path, v in tps.items()},
        **{f"{path}_tokens_per_s_rounds": v for path, v in tps.items()},
        "wrong": wrong,
        "text": expected if not wrong else None,
    }


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def run_stream(*, tokens: int, rounds: int) -> dict[str, Any]:
    """The streaming part, or why it did not run (the model is not pulled)."""
    from hecate.llm.gguf_model import prepare
    from hecate.llm.store import model_path, present
    from hecate_dev.chaos.scenarios import topology
    from hecate_launcher import node_env

    if not present(MODEL):
        return {"skipped": f"{MODEL} is not pulled (hecate model pull {MODEL})"}
    prepare(model_path(MODEL), float32=True)  # once, before six node processes would each build it
    env = node_env(bench_env())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / TOPOLOGY
        path.write_bytes(topology(TOPOLOGY))
        with standing(Path(tmp), path, {**env, "HECATE_STATE": tmp}) as st:
            wait_serving(st, MODEL, STREAM_TIMEOUT_S)
            figures: dict[str, Any] = run_on_uvloop(_measure(st, tokens, rounds))
    return {"model": MODEL, "prompt": PROMPT, "tokens": tokens, "rounds": rounds, **figures}
