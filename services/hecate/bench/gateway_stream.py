"""The streaming part of ``hecate bench gateway``: the inter-token latency the gateway
adds when it streams SmolLM2, on ``make run``'s swarm (two 3-stage pipelines, two
routers; :mod:`hecate.bench.gateway`'s :func:`standing`, with the gateway beside it).

Each token is timed twice, in this process, on one clock: when the router's
``StreamToken`` for it is published to the gateway's ``stream_to`` inbox (an observer
connection subscribed to ``_INBOX.>`` on the open bus sees the same message the gateway
does, at the same moment), and when its SSE chunk reaches the HTTP client (httpx,
streaming, as the ``openai`` SDK reads it). The gateway generates the request id; its
answer says it in ``x-request-id``, which picks the observed tokens of that request.
The k-th chunk with text is the k-th token with text (no stop string is set, so nothing
is held back); a pair whose texts differ is not counted, and counted as unmatched.

Streams run one at a time, direct (NATS with a ``stream_to`` of its own) and through the
gateway taking turns for ``rounds`` rounds, the same prompt and ``max_tokens``: tokens/s
of each (the tokens after the first, over the time after the first) and the text check
(the gateway's deltas, the direct stream and the direct reply all give one text).
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

from hecate.bench.gateway import Standing, bench_env, standing, wait_serving
from hecate.bench.gateway_load import TENANT, completion_body
from hecate.bench.generators import run_on_uvloop
from hecate.bench.openloop import percentile
from hecate.gateway.openai import parse
from hecate.wire import subjects
from hecate.wire.messages import InferReply, StreamToken

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
    inbox = nc.new_inbox()
    request = msgspec.structs.replace(
        request, tenant=TENANT, request_id=uuid.uuid4().hex, stream_to=inbox
    )
    got: list[tuple[float, StreamToken]] = []

    async def on_token(msg: Msg) -> None:
        got.append((time.perf_counter(), msgspec.json.decode(msg.data, type=StreamToken)))

    sub = await nc.subscribe(inbox, cb=on_token)
    try:
        msg = await nc.request(
            subjects.infer(MODEL), msgspec.json.encode(request), timeout=STREAM_TIMEOUT_S
        )
    finally:
        await sub.unsubscribe()
    reply = msgspec.json.decode(msg.data, type=InferReply)
    if not reply.ok:
        raise RuntimeError(f"a direct stream failed: {reply.error}")
    got.sort(key=lambda g: g[1].index)
    return [t for t, _ in got], "".join(g.text for _, g in got), reply.output or ""


async def _through_gateway(hx: httpx.AsyncClient, tokens: int) -> tuple[str, list[Stamped]]:
    """One stream through the gateway: its request id and its text chunks, stamped as
    they reached this client."""
    body = completion_body(MODEL, PROMPT, tokens, stream=True)
    chunks: list[Stamped] = []
    headers = {"content-type": "application/json"}
    async with hx.stream("POST", "/v1/completions", content=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the gateway answered {r.status_code}: {await r.aread()!r}")
        request_id = r.headers["x-request-id"]
        buffer = b""
        async for piece in r.aiter_raw():
            at = time.perf_counter()
            buffer += piece
            *frames, buffer = buffer.split(b"\n\n")
            for frame in frames:
                data = frame.removeprefix(b"data: ")
                if data == b"[DONE]":
                    continue
                chunk = msgspec.json.decode(data)
                if "error" in chunk:
                    raise RuntimeError(f"the stream broke: {chunk['error']}")
                text = chunk["choices"][0]["text"] if chunk.get("choices") else ""
                if text:
                    chunks.append((at, text))
    return request_id, chunks


async def _measure(st: Standing, tokens: int, rounds: int) -> dict[str, Any]:
    observer = Observer()
    watch = await nats.connect(st.url)
    nc = await nats.connect(st.url)
    await watch.subscribe("_INBOX.>", cb=observer.on_message)
    await watch.flush()
    added: list[float] = []
    unmatched = 0
    direct_tps: list[float] = []
    gateway_tps: list[float] = []
    texts: list[str] = []
    try:
        async with httpx.AsyncClient(base_url=st.base, timeout=STREAM_TIMEOUT_S) as hx:
            await _through_gateway(hx, 2)  # the connection and both paths warm
            await _direct(nc, 2)
            for _ in range(rounds):
                stamps, streamed, output = await _direct(nc, tokens)
                direct_tps.append(tokens_per_s(stamps))
                texts += [streamed, output]
                request_id, chunks = await _through_gateway(hx, tokens)
                await watch.flush()  # every token the observer will see, seen
                pairs, missed = matched(observer.seen.pop(request_id, {}), chunks)
                added += pairs
                unmatched += missed
                gateway_tps.append(tokens_per_s([at for at, _ in chunks]))
                texts.append("".join(text for _, text in chunks))
    finally:
        await nc.close()
        await watch.close()
    ordered = sorted(added)
    expected = texts[1] if len(texts) > 1 else ""
    wrong = sum(t != expected for t in texts)
    return {
        "added_us": {
            "p50": round(percentile(ordered, 0.50) * 1e6, 1),
            "p99": round(percentile(ordered, 0.99) * 1e6, 1),
            "max": round(ordered[-1] * 1e6, 1) if ordered else 0.0,
            "samples": len(ordered),
        },
        "unmatched": unmatched,
        "direct_tokens_per_s": _median(direct_tps),
        "gateway_tokens_per_s": _median(gateway_tps),
        "direct_tokens_per_s_rounds": direct_tps,
        "gateway_tokens_per_s_rounds": gateway_tps,
        "wrong": wrong,
        "text": expected if not wrong else None,
    }


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def run_stream(*, tokens: int, rounds: int) -> dict[str, Any]:
    """The streaming part, or why it did not run (the model is not pulled)."""
    from hecate.chaos.scenarios import topology
    from hecate.cli.up import node_env
    from hecate.llm.gguf_model import prepare
    from hecate.llm.store import model_path, present

    if not present(MODEL):
        return {"skipped": f"{MODEL} is not pulled (hecate model pull {MODEL})"}
    prepare(model_path(MODEL))  # once, before six node processes would each build it
    env = node_env(bench_env())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / TOPOLOGY
        path.write_bytes(topology(TOPOLOGY))
        with standing(Path(tmp), path, {**env, "HECATE_STATE": tmp}) as st:
            wait_serving(st, MODEL, STREAM_TIMEOUT_S)
            figures: dict[str, Any] = run_on_uvloop(_measure(st, tokens, rounds))
    return {"model": MODEL, "prompt": PROMPT, "tokens": tokens, "rounds": rounds, **figures}
