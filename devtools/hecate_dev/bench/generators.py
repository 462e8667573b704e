"""Open-loop load from several generator processes, each on uvloop.

One Python process can only publish so many requests per second; offered past that, it
falls behind its schedule and the path under test looks slower than it is. So the
offered rate is shared by ``count`` processes (:func:`hecate_dev.bench.openloop.share`),
each started once per configuration and kept for the whole sweep: the parent writes
one line of JSON per offered rate on their stdin (the rate, the window and the common
start on the system-wide monotonic clock), each answers with its requests' send and
reply times, and the parent summarises them as one schedule
(:func:`hecate_dev.bench.openloop.summarize`). Latency stays counted from the scheduled
send, so a generator that lags still charges its lag to the figures; the send-lag
column says when it did.

Run as a worker: ``python -m hecate_dev.bench.generators URL SUBJECT BODY_HEX JUDGE``, the
credentials from the environment (:meth:`Credentials.from_env`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Coroutine
from typing import IO, Any

import msgspec
import nats

from hecate.bus.credentials import Credentials
from hecate_dev.bench.openloop import Judge, Reply, offer_share, summarize

START_DELAY_S = 0.05  # the common start, after every generator has read its line


class _Offer(msgspec.Struct):
    rate: float
    seconds: float
    timeout_s: float
    start: float
    index: int
    of: int


class _Result(msgspec.Struct):
    sent_at: dict[int, float]
    replies: list[tuple[int, float, bool]]


def run_on_uvloop(coro: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run`` on uvloop when it is installed (every load generator here)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


def _judge(name: str) -> Judge | None:
    if name == "any":
        return None
    from hecate.wire.messages import InferReply

    decoder = msgspec.json.Decoder(InferReply)

    def ok(data: bytes) -> bool:
        try:
            return decoder.decode(data).ok
        except msgspec.DecodeError:
            return False

    return ok


async def _work(url: str, subject: str, body: bytes, judge: Judge | None) -> None:
    nc = await nats.connect(url, **Credentials.from_env().options())
    loop = asyncio.get_running_loop()
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.buffer.readline):
            job = msgspec.json.decode(line, type=_Offer)
            sent_at, replies = await offer_share(
                nc,
                subject,
                body,
                rate=job.rate,
                seconds=job.seconds,
                timeout_s=job.timeout_s,
                start=job.start,
                index=job.index,
                of=job.of,
                judge=judge,
            )
            result = _Result(sent_at, [(i, r.at, r.ok) for i, r in replies.items()])
            out.write(msgspec.json.encode(result) + b"\n")
            out.flush()
    finally:
        await nc.close()


class Generators:
    """``count`` generator processes loading ``subject`` on ``url``."""

    def __init__(
        self,
        url: str,
        subject: str,
        body: bytes,
        *,
        count: int,
        routed: bool,
        env: dict[str, str],
        creds: Credentials,
    ) -> None:
        argv = [
            sys.executable,
            "-m",
            "hecate_dev.bench.generators",
            url,
            subject,
            body.hex(),
            "infer" if routed else "any",
        ]
        self.procs = [
            subprocess.Popen(
                argv,
                env={**env, **creds.to_env()},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            for _ in range(count)
        ]
        for proc in self.procs:
            if readline(proc) != b"ready\n":
                self.stop()
                raise RuntimeError(f"a load generator for {subject} did not start")

    def offer(self, rate: float, seconds: float, timeout_s: float) -> dict[str, Any]:
        """Offer ``rate`` requests/s for ``seconds`` from every generator at once;
        :func:`summarize`'s figures, with how many generators shared the rate."""
        start = time.monotonic() + START_DELAY_S
        n = len(self.procs)
        for k, proc in enumerate(self.procs):
            job = _Offer(rate, seconds, timeout_s, start, k, n)
            writeline(proc, msgspec.json.encode(job) + b"\n")
        sent: dict[int, float] = {}
        replies: dict[int, Reply] = {}
        for proc in self.procs:
            part = msgspec.json.decode(readline(proc), type=_Result)
            sent.update(part.sent_at)
            replies.update({i: Reply(at, ok) for i, at, ok in part.replies})
        sent_at = [sent[i] for i in sorted(sent)]
        return {**summarize(rate, seconds, timeout_s, sent_at, replies), "generators": n}

    def stop(self) -> None:
        stop_workers(self.procs, timeout_s=5)


def stop_workers(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Close every worker's stdin (its signal to finish), then wait; kill a straggler."""
    for proc in procs:
        if proc.stdin is not None:
            proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pipe(stream: IO[bytes] | None) -> IO[bytes]:
    if stream is None:
        raise RuntimeError("a load worker has no pipe")
    return stream


def readline(proc: subprocess.Popen[bytes]) -> bytes:
    """A worker's next line; an error naming its exit code if it has exited."""
    line = pipe(proc.stdout).readline()
    if not line:
        raise RuntimeError(f"a load worker exited (code {proc.poll()})")
    return line


def writeline(proc: subprocess.Popen[bytes], line: bytes) -> None:
    stdin = pipe(proc.stdin)
    stdin.write(line)
    stdin.flush()


def main(argv: list[str]) -> None:
    url, subject, body, judge = argv
    run_on_uvloop(_work(url, subject, bytes.fromhex(body), _judge(judge)))


if __name__ == "__main__":
    main(sys.argv[1:])
