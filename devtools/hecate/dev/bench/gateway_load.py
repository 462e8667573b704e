"""The load of ``hecate bench gateway``: the same completions asked directly on NATS or
over HTTP through the gateway, by clients cheap enough not to be the limit.

Over HTTP, a load generator built on a full client (httpx, the ``openai`` SDK) spends
more CPU per request than the gateway does, and on a small machine it would measure
itself. :class:`Http1` is the least an HTTP/1.1 client can do: one keep-alive
connection, the request's bytes encoded once, the response read by its
``content-length``. On NATS, nats-py's own ``request``, as any NATS client does.

Every answer is checked: the completion's text must be the text a direct request got for
the same prompt beforehand; anything else (an error, another text) is counted wrong, and
no wrong answer counts as throughput.

:class:`Workers` runs ``count`` worker processes on uvloop (``python -m
hecate.dev.bench.gateway_load``), each keeping its share of the clients busy in a closed loop
for a window that starts at the same instant in all of them (the system-wide monotonic
clock); each reports what it got and the CPU it spent itself, so the report can say
what the load generators cost.
"""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import nats
from nats.aio.client import Client

from hecate.dev.bench.generators import readline, run_on_uvloop, stop_workers, writeline
from hecate.gateway.openai import parse
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest

Mode = Literal["nats", "http"]
TENANT = "default"  # the gateway's tenant for every caller when it runs --open
START_DELAY_S = 0.5  # the common start: every worker has read its line, opened its connections
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
class _Window(msgspec.Struct):
    start: float  # time.monotonic()
    seconds: float
    clients: int  # in this worker


class Tally(msgspec.Struct):
    """One worker's window: answers right, wrong and failed (no answer), and its CPU."""

    ok: int = 0
    wrong: int = 0
    failed: int = 0
    cpu_s: float = 0.0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Worker:
    """The worker process: its clients (an HTTP connection each, or one NATS connection
    they share) and its windows, one per line on stdin."""

    def __init__(self, mode: Mode, target: str, asks: list[Ask]) -> None:
        self.mode = mode
        self.target = target
        self.asks = asks
        self.nc: Client | None = None
        self.conns: list[Http1] = []

    async def run(self) -> None:
        if self.mode == "nats":
            self.nc = await nats.connect(self.target)
        loop = asyncio.get_running_loop()
        out = sys.stdout.buffer
        out.write(b"ready\n")
        out.flush()
        try:
            while line := await loop.run_in_executor(None, sys.stdin.buffer.readline):
                tally = await self.window(msgspec.json.decode(line, type=_Window))
                out.write(msgspec.json.encode(tally) + b"\n")
                out.flush()
        finally:
            if self.nc is not None:
                await self.nc.close()

    async def window(self, window: _Window) -> Tally:
        tally = Tally()
        if self.mode == "http":
            # Fresh connections for each window, opened before it starts: the server
            # closes one left idle (uvicorn after 5 s), and its first request in the
            # next window would fail for a reason that is not the load.
            self.conns = [await Http1.open(self.target) for _ in range(window.clients)]
        await asyncio.sleep(max(0.0, window.start - time.monotonic()))
        cpu = _cpu_s()
        stop_at = window.start + window.seconds
        try:
            await asyncio.gather(*(self.client(c, tally, stop_at) for c in range(window.clients)))
        finally:
            tally.cpu_s = _cpu_s() - cpu
            for conn in self.conns:
                await conn.close()
            self.conns = []
        return tally

    async def client(self, c: int, tally: Tally, stop_at: float) -> None:
        """Client ``c`` in a closed loop: ask, check, again, until ``stop_at``; only
        answers that arrive inside the window count."""
        asks = self.asks
        raws = [Http1.post_bytes(self.target, "/v1/completions", a.body) for a in asks]
        i = c
        while time.monotonic() < stop_at:
            k = i % len(asks)
            i += 1
            text: str | None
            if self.nc is not None:
                text = await ask_direct(self.nc, asks[k])
            else:
                try:
                    status, body = await asyncio.wait_for(self.conns[c].send(raws[k]), TIMEOUT_S)
                    text = text_of_completion(body) if status == 200 else None
                except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError):
                    # The connection is in an unknown state: another one.
                    await self.conns[c].close()
                    self.conns[c] = await Http1.open(self.target)
                    text = None
            if time.monotonic() > stop_at:
                break
            if text is None:
                tally.failed += 1
            elif text != asks[k].expected:
                tally.wrong += 1
            else:
                tally.ok += 1


class Workers:
    """``count`` worker processes asking ``target`` (a NATS URL, or the gateway's base
    URL); :meth:`start` opens a window, :meth:`collect` reads what it got."""

    def __init__(
        self,
        mode: Mode,
        target: str,
        asks: list[Ask],
        *,
        count: int,
        env: dict[str, str],
    ) -> None:
        spec = msgspec.json.encode([(a.model, a.body.decode(), a.expected) for a in asks])
        argv = [sys.executable, "-m", "hecate.dev.bench.gateway_load", mode, target]
        self.procs = [
            subprocess.Popen(
                [*argv, spec.decode()], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            for _ in range(count)
        ]
        for proc in self.procs:
            if readline(proc) != b"ready\n":
                self.stop()
                raise RuntimeError(f"a {mode} load worker did not start")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self, seconds: float, clients: int) -> tuple[float, float]:
        """Open a window of ``seconds`` in every worker at once, ``clients`` clients in
        all (shared out evenly); when it starts and ends (``time.monotonic()``).
        :meth:`collect` waits for its tallies."""
        start = time.monotonic() + START_DELAY_S
        n = len(self.procs)
        for k, proc in enumerate(self.procs):
            window = _Window(start, seconds, clients // n + (k < clients % n))
            writeline(proc, msgspec.json.encode(window) + b"\n")
        return start, start + seconds

    def collect(self) -> Tally:
        """The tallies of the window :meth:`start` opened, summed over the workers."""
        total = Tally()
        for proc in self.procs:
            part = msgspec.json.decode(readline(proc), type=Tally)
            total.ok += part.ok
            total.wrong += part.wrong
            total.failed += part.failed
            total.cpu_s += part.cpu_s
        return total

    def stop(self) -> None:
        stop_workers(self.procs, timeout_s=10)


def main(argv: list[str]) -> None:
    name, target, spec = argv
    if name not in ("nats", "http"):
        raise SystemExit(f"unknown mode {name!r}")
    mode: Mode = "nats" if name == "nats" else "http"
    asks = [
        Ask(m, body.encode(), expected)
        for m, body, expected in msgspec.json.decode(spec, type=list[tuple[str, str, str]])
    ]
    run_on_uvloop(_Worker(mode, target, asks).run())


if __name__ == "__main__":
    main(sys.argv[1:])
