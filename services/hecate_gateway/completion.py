"""One ``/v1/chat/completions`` or ``/v1/completions`` answer, as an ASGI response:
the swarm call, the client's disconnect, and what goes back, whole or streamed.

A streamed answer's status line waits for the swarm's first token (or its reply): a
refusal before any token (429 with its slot, 404, 503) is then a real HTTP error the
client's own retry logic acts on, not an error event inside a 200 stream. Once tokens
flow, a failure is an SSE ``data: {"error": ...}`` event, and the text before it has
already reached the client.

A client that hangs up, whether it was streaming or waiting for a whole answer, gets the
swarm told to stop (``InferCancel``), once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

import msgspec
from opentelemetry import trace
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hecate.bus import tracing
from hecate.bus.logs import event
from hecate.wire.messages import InferReply, StreamToken, TokenLogprob
from hecate_gateway import shapes
from hecate_gateway.bridge import Bridge, Call
from hecate_gateway.metrics import Metrics
from hecate_gateway.openai import ApiError, Prepared, swarm_error
from hecate_gateway.swarm import SwarmWatch
from hecate_gateway.tools import CallStream

JSON = b"application/json"


@dataclass(frozen=True)
class Context:
    """What every answer needs from the gateway."""

    bridge: Bridge
    watch: SwarmWatch
    metrics: Metrics
    log: logging.Logger
    traced: bool = False


def error_headers(error: ApiError, request_id: str = "") -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", JSON)]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    if request_id:
        headers.append((b"x-request-id", request_id.encode()))
    return headers


def _route(reply: InferReply) -> str:
    return ",".join(s.node_id for s in reply.route.stages) if reply.route else ""


class Completion(Response):
    def __init__(self, ctx: Context, prepared: Prepared, tenant: str, body_hash: str) -> None:
        super().__init__()
        self.ctx = ctx
        self.prepared = prepared
        self.tenant = tenant
        self.body_hash = body_hash
        self.request_id = uuid.uuid4().hex
        self.created = int(time.time())
        self.status = 499  # until something is sent: the client hung up
        self.model_label = ""  # a model the swarm answered for (never a client's string)

    async def __call__(self, _scope: Scope, receive: Receive, send: Send) -> None:
        ctx, p = self.ctx, self.prepared
        started = time.perf_counter()
        request = msgspec.structs.replace(p.request, tenant=self.tenant, request_id=self.request_id)
        headers = tracing.inject() if ctx.traced else None
        call = await ctx.bridge.call(
            p.model, request, body_hash=self.body_hash, stream=p.stream, headers=headers
        )
        watcher = asyncio.create_task(_hang_up_on_disconnect(receive, call))
        ctx.metrics.in_flight.inc()
        try:
            if p.stream:
                await self._stream(call, send, started)
            else:
                await self._whole(call, send)
        except OSError:  # the client went away while we wrote
            await call.hang_up()
            self.status = 499
        except asyncio.CancelledError:  # the server stopped before the answer
            await call.hang_up()
            raise
        finally:
            watcher.cancel()
            await call.close()
            ctx.metrics.in_flight.dec()
            self._account(started)

    def _account(self, started: float) -> None:
        m, model = self.ctx.metrics, self.model_label
        endpoint = "chat" if self.prepared.kind == "chat" else "completions"
        m.requests.labels(endpoint=endpoint, model=model, status=str(self.status)).inc()
        m.duration.labels(model=model).observe(time.perf_counter() - started)
        if self.status == 429:
            m.rate_limited.labels(model=model).inc()
        elif self.status == 499:
            m.cancelled.inc()
        span = trace.get_current_span()
        span.set_attribute("hecate.request_id", self.request_id)
        span.set_attribute("hecate.tenant", self.tenant)

    def _call_id(self) -> str:
        return f"call_{self.request_id[:24]}"

    def _label(self, reply: InferReply) -> None:
        model = self.prepared.model
        if reply.ok or reply.route is not None or model in self.ctx.watch.servable_models():
            self.model_label = model

    def _answered(self, reply: InferReply, answer: shapes.Answer) -> None:
        m, model = self.ctx.metrics, self.model_label
        m.tokens.labels(model=model).inc(answer.completion_tokens)
        m.prompt_tokens.labels(model=model).inc(answer.prompt_tokens)
        if reply.degraded:
            m.degraded.labels(model=model).inc()
        if reply.prefix is not None:
            m.prefix_routed.labels(model=model, outcome=reply.prefix).inc()

    def _ok_headers(self, reply: InferReply, content_type: bytes) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", content_type), (b"x-request-id", self.request_id.encode())]
        route = _route(reply)
        if route:
            headers.append((b"x-hecate-route", route.encode()))
        if reply.degraded:
            headers.append((b"x-hecate-degraded", b"true"))
        return headers

    def _failure(self, reply: InferReply) -> ApiError:
        err = reply.error
        code, message = (err.code, err.message) if err else ("internal", "no answer, no error")
        error = swarm_error(code, message, kind=self.prepared.kind, partial=reply.output)
        if error.status == 429:
            wait = reply.retry_after_s
            if wait is None and err is not None:
                wait = err.retry_after_s
            error = _with_retry_after(error, wait)
        if error.status >= 500:
            event(self.ctx.log, "swarm error", logging.INFO, code=code, message=message)
        return error

    async def _whole(self, call: Call, send: Send) -> None:
        reply = await call.reply()
        if reply is None:  # the client hung up first
            return
        self._label(reply)
        if not reply.ok:
            error = self._failure(reply)
            self.status = error.status
            await _send(send, error.status, error_headers(error, self.request_id),
                        shapes.error_body(error))  # fmt: skip
            return
        answer = shapes.answer_of(
            reply, self.prepared.stop, tooling=self.prepared.tooling, call_id=self._call_id()
        )
        self._answered(reply, answer)
        self.ctx.watch.count_tokens(answer.completion_tokens, time.monotonic())
        p = self.prepared
        rid = shapes.response_id(p.kind, self.request_id)
        body = shapes.body(p.kind, rid, self.created, p.model, answer)
        self.status = 200
        await _send(send, 200, self._ok_headers(reply, JSON), body)

    async def _stream(self, call: Call, send: Send, started: float) -> None:
        p, m = self.prepared, self.ctx.metrics
        frames = shapes.Frames(
            p.kind, shapes.response_id(p.kind, self.request_id), self.created, p.model,
            p.include_usage,
        )  # fmt: skip
        text = shapes.StreamText(p.stop)
        owed: list[TokenLogprob] = []  # log-probabilities of tokens no frame carried yet
        held = ""  # text held back while it may begin a tool call
        calls = CallStream(p.tooling.mode, self._call_id()) if p.tooling is not None else None
        began = False
        first = True
        last_at = 0.0
        while True:
            item = await call.next()
            if item is None:  # the client hung up mid-stream
                self.status = 499
                return
            if isinstance(item, StreamToken):
                now = time.perf_counter()
                self.model_label = p.model
                if last_at:
                    m.itl.labels(model=p.model).observe(now - last_at)
                last_at = now
                self.ctx.watch.count_tokens(1, time.monotonic())
                out = b""
                if not began:
                    began = True
                    self.status = 200
                    await _start(send, 200, _sse_headers(self.request_id))
                    out = frames.start()
                if item.logprob is not None:
                    owed.append(item.logprob)
                deltas = calls.add(item.text) if calls is not None else None
                if deltas is not None:  # a call, or perhaps one: streamed as a call
                    held += item.text
                    piece = ""
                    out += frames.calls(deltas)
                else:
                    piece, held = text.add(held + item.text), ""
                if piece:
                    out += frames.delta(piece, owed)
                    owed = []
                    if first:
                        first = False
                        m.ttft.labels(model=p.model).observe(now - started)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                continue
            reply = item
            self._label(reply)
            if not reply.ok:
                error = self._failure(reply)
                self.status = error.status
                if not began:
                    await _send(send, error.status, error_headers(error, self.request_id),
                                shapes.error_body(error))  # fmt: skip
                else:
                    await send({"type": "http.response.body", "body": frames.error(error)})
                return
            answer = shapes.answer_of(
                reply, p.stop, streamed=call.tokens, tooling=p.tooling, call_id=self._call_id()
            )
            self._answered(reply, answer)
            unstreamed = answer.completion_tokens - call.tokens  # a model that does not stream
            if unstreamed > 0:
                self.ctx.watch.count_tokens(unstreamed, time.monotonic())
            out = b""
            if not began:  # nothing streamed: the route is known before the headers go
                self.status = 200
                headers = self._ok_headers(reply, b"text/event-stream; charset=utf-8")
                await _start(send, 200, headers + _SSE_EXTRA)
                out = frames.start()
            if not call.tokens and answer.logprobs:  # nothing streamed: all of them
                owed = list(answer.logprobs)
            if calls is not None and answer.tool_calls:
                rest = frames.calls(calls.finish(answer.tool_calls[0]), owed)
            elif calls is not None and calls.named:  # a call cut short: it stays cut
                rest = b""
            else:
                rest = frames.delta(text.finish(answer.text), owed)
            if rest:
                owed = []
                if first:
                    m.ttft.labels(model=p.model).observe(time.perf_counter() - started)
            out += rest + frames.end(answer, reply.degraded, _route(reply), owed)
            await send({"type": "http.response.body", "body": out})
            return


_SSE_EXTRA = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def _sse_headers(request_id: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"x-request-id", request_id.encode()),
        *_SSE_EXTRA,
    ]


def _with_retry_after(error: ApiError, retry_after_s: float | None) -> ApiError:
    """429: ``retry-after-ms`` is the exact slot the desk booked (what OpenAI's clients
    read first), ``Retry-After`` the same in whole seconds, rounded up."""
    if retry_after_s is None:
        return error
    wait_ms = max(1, int(-(-retry_after_s * 1000 // 1)))
    headers = {
        **error.headers,
        "Retry-After": str(max(1, -(-wait_ms // 1000))),
        "retry-after-ms": str(wait_ms),
    }
    return ApiError(
        error.status, error.message, error.type, error.code, error.param, headers, error.partial
    )


async def _hang_up_on_disconnect(receive: Receive, call: Call) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            await call.hang_up()
            return


async def _start(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await _start(send, status, headers)
    await send({"type": "http.response.body", "body": body})
