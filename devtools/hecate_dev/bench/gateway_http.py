"""The clients of ``hecate bench gateway``, cheap enough not to be the limit: a
completion asked directly on NATS (the request the gateway itself would send), and
:class:`Http1`, the least an HTTP/1.1 client can do (one keep-alive connection, the
request's bytes encoded once, the response read by its ``content-length``); and how
each answer's text is read for the checks (see :mod:`hecate_dev.bench.gateway_load`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client

from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from hecate_gateway.openai import parse

TENANT = "default"  # the gateway's tenant for every caller when it runs --open
TIMEOUT_S = 10.0


class _Choice(msgspec.Struct):
    text: str


class Completion(msgspec.Struct):
    """What the checks read of a ``/v1/completions`` answer."""

    choices: list[_Choice]


_completion = msgspec.json.Decoder(Completion)
_reply = msgspec.json.Decoder(InferReply)


@dataclass(frozen=True)
class Ask:
    """One prompt: its ``/v1/completions`` body and the text every answer must have."""

    model: str
    body: bytes
    expected: str
    # The body as the gateway turns it into a swarm request, worked out once: a NATS
    # client has its request at hand, it does not parse JSON to make it.
    swarm: InferRequest = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        request = parse("completion", self.body).request
        object.__setattr__(self, "swarm", msgspec.structs.replace(request, tenant=TENANT))

    def request(self) -> InferRequest:
        """The request the gateway makes of this body (its own id, as every request
        has), as a NATS client makes it."""
        return msgspec.structs.replace(self.swarm, request_id=uuid.uuid4().hex)


def completion_body(model: str, prompt: str, max_tokens: int, stream: bool = False) -> bytes:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    return msgspec.json.encode(body)


def text_of_completion(body: bytes) -> str | None:
    """The text of a ``/v1/completions`` answer, or None when it is not one."""
    try:
        return _completion.decode(body).choices[0].text
    except (msgspec.DecodeError, IndexError):
        return None


def text_of_reply(data: bytes) -> str | None:
    """The output of an ok ``InferReply``, or None."""
    try:
        reply = _reply.decode(data)
    except msgspec.DecodeError:
        return None
    return (reply.output or "") if reply.ok else None


async def ask_direct(nc: Client, ask: Ask) -> str | None:
    """The swarm's text for ``ask``, asked on NATS (None: an error, or no reply)."""
    try:
        msg = await nc.request(
            subjects.infer(ask.model), msgspec.json.encode(ask.request()), timeout=TIMEOUT_S
        )
    except Exception:  # a timeout or no responders: not an answer
        return None
    return text_of_reply(msg.data)


class Http1:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, base: str) -> Http1:
        host, port = base.removeprefix("http://").rstrip("/").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    @staticmethod
    def post_bytes(base: str, path: str, body: bytes) -> bytes:
        """The bytes of a POST of ``body`` (JSON) to ``base`` + ``path``, encoded once
        and sent as often as needed."""
        host = base.removeprefix("http://").rstrip("/")
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        """Send a request made by :meth:`post_bytes`; its status and body (``content-length``
        framing: what the gateway gives every answer that is not a stream)."""
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        at = head.lower().find(b"\r\ncontent-length:")
        if at < 0:
            raise ValueError("an answer without content-length")
        end = head.index(b"\r\n", at + 2)
        body = await self.reader.readexactly(int(head[at + 17 : end]))
        return status, body

    async def stream(self, raw: bytes) -> tuple[int, dict[str, str]]:
        """Send a request made by :meth:`post_bytes` whose answer streams: its status and
        headers (lower-case names); :meth:`chunks` then reads the body."""
        self.writer.write(raw)
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status, *lines = head.split("\r\n")
        fields = (line.split(":", 1) for line in lines if ":" in line)
        return int(status[9:12]), {k.strip().lower(): v.strip() for k, v in fields}

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body of a streamed answer (``transfer-encoding: chunked``), chunk by chunk
        as each arrives."""
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")  # the end of the (empty) trailer
                return
            yield (await self.reader.readexactly(size + 2))[:-2]

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            return


# -- the worker process -------------------------------------------------------------------
