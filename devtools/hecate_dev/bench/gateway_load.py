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
hecate_dev.bench.gateway_load``), each keeping its share of the clients busy in a closed loop
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
from typing import Literal

import msgspec
import nats
from nats.aio.client import Client

from hecate_dev.bench.gateway_http import (
    TENANT,
    TIMEOUT_S,
    Ask,
    Completion,
    Http1,
    ask_direct,
    completion_body,
    text_of_completion,
    text_of_reply,
)
from hecate_dev.bench.generators import readline, run_on_uvloop, stop_workers, writeline

__all__ = [
    "TENANT",
    "TIMEOUT_S",
    "Ask",
    "Completion",
    "Http1",
    "Workers",
    "ask_direct",
    "completion_body",
    "text_of_completion",
    "text_of_reply",
]

Mode = Literal["nats", "http"]
START_DELAY_S = 0.5  # the common start: every worker has read its line, opened its connections


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
        argv = [sys.executable, "-m", "hecate_dev.bench.gateway_load", mode, target]
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
