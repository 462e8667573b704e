"""The service shell on a real nats-server: layers around a handler, deferred replies.

A tiny service is built inline per test and driven with a plain client, the way
Starlette's tests build a small app and call it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hecate.bus.server import NatsServer
from hecate.bus.service import Request, Service, ServiceError

KIND = "shell"


class Ask(msgspec.Struct, frozen=True, kw_only=True):
    text: str


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    text: str


_answer = msgspec.json.Decoder(Answer)


@dataclass
class Shell:
    svc: Service
    spans: InMemorySpanExporter
    held: asyncio.Queue[Request[Ask]] = field(default_factory=asyncio.Queue)
    seen: list[Ask] = field(default_factory=list)

    async def deferred(self, req: Request[Ask]) -> None:
        """Keeps the handle and returns: the test answers later."""
        self.seen.append(req.body)
        self.held.put_nowait(req)

    async def direct(self, ask: Ask, headers: Mapping[str, str]) -> Answer:
        del headers
        self.seen.append(ask)
        if ask.text == "refuse":
            raise ServiceError("rate_limited", "slow down", retry_after_s=0.5)
        if ask.text == "crash":
            raise RuntimeError("secret internals")
        if ask.text == "huge":
            return Answer(text="x" * (2 * 1024 * 1024))
        return Answer(text=ask.text.upper())

    def server_spans(self) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith(KIND)]

    async def stats(self, client: Client, endpoint: str) -> dict[str, Any]:
        msg = await client.request(f"$SRV.STATS.{self.svc.name}", b"", timeout=5)
        doc = json.loads(msg.data)
        found: dict[str, Any] = next(e for e in doc["endpoints"] if e["name"] == endpoint)
        return found


def _service(instance_id: str, provider: TracerProvider | None = None) -> Service:
    return Service(
        kind=KIND,
        name="shell",
        instance_id=instance_id,
        description="a test service",
        log=logging.getLogger("test.shell"),
        tracer_provider=provider,
    )


@pytest.fixture
async def shell(nats_server: NatsServer) -> AsyncIterator[Shell]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    svc = _service("s1", provider)
    await svc.start(nats_server.url)
    shell = Shell(svc=svc, spans=exporter)
    await svc.add_endpoint("later", "test.later", Ask, shell.deferred, deferred=True, max_bytes=64)
    await svc.add_endpoint("now", "test.now", Ask, shell.direct)
    await svc.ready()
    yield shell
    await svc.stop(grace=1.0)


async def _request(client: Client, subject: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    msg = await client.request(subject, data, timeout=5)
    return msg.data, dict(msg.headers or {})


async def test_a_deferred_handler_answers_after_it_has_returned(
    shell: Shell, client: Client
) -> None:
    asked = asyncio.ensure_future(_request(client, "test.later", b'{"text":"hi"}'))
    req = await shell.held.get()  # the handler has returned; nothing is answered yet
    assert not req.answered
    assert req.body == Ask(text="hi")
    assert req.data == b'{"text":"hi"}'
    assert shell.server_spans() == []  # the span lasts until the answer
    assert await req.respond(Answer(text="later"))
    data, _headers = await asked
    assert _answer.decode(data) == Answer(text="later")
    (span,) = shell.server_spans()
    assert span.name == "shell later"
    stats = await shell.stats(client, "later")
    assert stats["num_requests"] == 1
    assert stats["num_errors"] == 0


async def test_a_request_is_answered_once_and_a_second_answer_sends_nothing(
    shell: Shell, client: Client
) -> None:
    inbox = client.new_inbox()
    sub = await client.subscribe(inbox)
    await client.publish("test.later", b'{"text":"hi"}', reply=inbox)
    req = await shell.held.get()
    assert await req.respond(Answer(text="first"))
    assert not await req.respond(Answer(text="second"))
    assert not await req.error("internal", "too late")
    # The same connection the replies left on: whatever was sent arrives before this.
    await shell.svc.nc.publish(inbox, b"end")
    got = [(await sub.next_msg(timeout=5)).data for _ in range(2)]
    assert got == [b'{"text":"first"}', b"end"]
    assert len(shell.server_spans()) == 1
    stats = await shell.stats(client, "later")
    assert stats["num_errors"] == 0


async def test_oversized_and_malformed_messages_get_typed_errors_and_miss_the_handler(
    shell: Shell, client: Client
) -> None:
    big, headers = await _request(client, "test.later", b'{"text":"' + b"a" * 100 + b'"}')
    assert headers["Hecate-Error"] == "payload_too_large"
    assert json.loads(big)["error"]["code"] == "payload_too_large"
    for bad in (b"{not json", b'{"text": 3}', b"{}"):
        data, headers = await _request(client, "test.later", bad)
        assert headers["Hecate-Error"] == "bad_request", bad
        assert json.loads(data) == {"ok": False, "error": json.loads(data)["error"]}
    assert shell.seen == []
    assert shell.held.empty()
    stats = await shell.stats(client, "later")
    assert stats["num_requests"] == 4
    assert stats["num_errors"] == 4
    assert stats["data"]["rejected"] == {"payload_too_large": 1, "bad_request": 3}
    # Refused messages are traced too, each span closed with its code.
    codes = [s.attributes["error.code"] for s in shell.server_spans()]
    assert sorted(codes) == ["bad_request"] * 3 + ["payload_too_large"]


async def test_an_error_through_the_handle_is_typed_and_counted_in_srv_stats(
    shell: Shell, client: Client
) -> None:
    asked = asyncio.ensure_future(_request(client, "test.later", b'{"text":"hi"}'))
    req = await shell.held.get()
    assert await req.error("rate_limited", "slow down", retry_after_s=1.5)
    data, headers = await asked
    assert headers["Hecate-Error"] == "rate_limited"
    assert headers["Retry-After-Ms"] == "1500"
    assert json.loads(data)["error"] == {
        "code": "rate_limited",
        "message": "slow down",
        "retry_after_s": 1.5,
    }
    stats = await shell.stats(client, "later")
    assert stats["num_errors"] == 1
    assert stats["last_error"] == "rate_limited: slow down"
    assert stats["data"]["rejected"] == {"rate_limited": 1}
    (span,) = shell.server_spans()
    assert span.attributes["error.code"] == "rate_limited"


async def test_a_reply_over_max_payload_becomes_payload_too_large(
    shell: Shell, client: Client
) -> None:
    asked = asyncio.ensure_future(_request(client, "test.later", b'{"text":"hi"}'))
    req = await shell.held.get()
    assert await req.respond(b"x" * (shell.svc.nc.max_payload + 1))
    data, headers = await asked
    assert headers["Hecate-Error"] == "payload_too_large"
    assert "max_payload" in json.loads(data)["error"]["message"]
    # A handler that returns its reply gets the same treatment.
    data, headers = await _request(client, "test.now", b'{"text":"huge"}')
    assert headers["Hecate-Error"] == "payload_too_large"
    assert (await shell.stats(client, "now"))["data"]["rejected"] == {"payload_too_large": 1}


async def test_a_handler_that_returns_its_reply_works_as_before(
    shell: Shell, client: Client
) -> None:
    data, headers = await _request(client, "test.now", b'{"text":"hi"}')
    assert _answer.decode(data) == Answer(text="HI")
    assert "Hecate-Error" not in headers
    data, headers = await _request(client, "test.now", b'{"text":"refuse"}')
    assert headers["Hecate-Error"] == "rate_limited"
    assert headers["Retry-After"] == "1"
    data, headers = await _request(client, "test.now", b'{"text":"crash"}')
    assert headers["Hecate-Error"] == "internal"
    assert b"secret" not in data  # never a stack trace on the wire
    stats = await shell.stats(client, "now")
    assert stats["num_requests"] == 3
    assert stats["num_errors"] == 2
    assert len(shell.server_spans()) == 3  # each closed when its handler returned


async def test_a_deferred_request_nobody_waits_on_closes_when_the_handler_returns(
    shell: Shell, client: Client
) -> None:
    await client.publish("test.later", b'{"text":"fire and forget"}')
    req = await shell.held.get()
    assert req.reply == ""
    (span,) = shell.server_spans()
    assert span.name == "shell later"


async def test_a_connection_that_is_back_is_counted_back_before_its_callback(
    tmp_path: Path,
) -> None:
    """nats-py reports a connection connected (and delivers on it) one round trip before
    it calls the reconnected callback. Whatever reads ``reconnected_at`` in that gap (the
    telemetry's sweep, a router's no-responders) must already see the reconnect, or it
    takes the outage for the other clients' silence."""
    server = NatsServer(tmp_path / "nats").start()
    port = server.client_port
    svc = _service("s2")
    try:
        await svc.start(server.url)
        assert svc.reconnected_at == 0.0
        conns = (svc.inbound, svc.outbound)
        server.stop()
        while any(c is not None and c.is_connected for c in conns):
            await asyncio.sleep(0.001)
        lost = time.monotonic()
        server = NatsServer(tmp_path / "nats", port=port).start()
        while not any(c is not None and c.is_connected for c in conns):
            await asyncio.sleep(0)  # runs in the gap, while the client awaits its PONG
        assert svc.reconnected_at >= lost
    finally:
        await svc.stop(grace=1.0)
        server.stop()


async def test_a_service_keeps_both_its_connections_on_one_server_and_moves_them_together(
    tmp_path: Path,
) -> None:
    """A service's connections share a server, and move to the same next one when it is
    lost: a node whose serving connection sat behind a cut server while its heartbeats
    went out on another would be alive to telemetry and unreachable to every router."""
    servers = [NatsServer(tmp_path / f"nats-{i}", jetstream=False).start() for i in range(3)]
    url = ",".join(s.url for s in servers)
    services = [_service(f"p{i}") for i in range(12)]

    def on(svc: Service) -> tuple[str, str]:
        assert svc.inbound is not None
        assert svc.outbound is not None
        i, o = svc.inbound.connected_url, svc.outbound.connected_url
        return (i.netloc if i else "", o.netloc if o else "")

    try:
        for svc in services:
            await svc.start(url)
        places = [on(svc) for svc in services]
        assert all(i == o for i, o in places), places
        # Spread as nats-py would spread them (12 on one of 3 by chance: 3 in 3^12).
        assert len({i for i, _ in places}) > 1, places
        first = services[0]
        lost = places[0][0]
        gone = next(s for s in servers if s.url.endswith(lost))
        gone.stop()
        async with asyncio.timeout(10):
            while True:
                now = on(first)
                if lost not in now and all(now):
                    break
                await asyncio.sleep(0.01)
        i, o = now
        assert i == o, now
    finally:
        for svc in services:
            await svc.stop(grace=1.0)
        for s in servers:
            s.stop()
