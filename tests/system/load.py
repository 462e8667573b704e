"""A bounded load generator that checks every answer against the reference."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError, TimeoutError

from hecate.model.toy import reference
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from tests.support.waits import until

_reply = msgspec.json.Decoder(InferReply)


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    wrong: int = 0
    errors: int = 0
    lost: int = 0
    client_retries: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"sent={self.sent} ok={self.ok} wrong={self.wrong} errors={self.errors} "
            f"lost={self.lost} client_retries={self.client_retries} {self.error_codes}"
        )


async def run_load(
    nc: Client,
    model: str,
    layers: int,
    stop: asyncio.Event,
    *,
    workers: int = 4,
    timeout: float = 3.0,
    client_attempts: int = 2,
    tally: Tally | None = None,
) -> Tally:
    """Each worker sends one request at a time until ``stop``. A request with no reply
    within ``timeout`` is re-sent (as any NATS client would) up to ``client_attempts``
    times; only then is it counted lost. ``tally``: count into this one (it can be read
    while the load runs)."""
    tally = Tally() if tally is None else tally
    expected: dict[str, str] = {}

    async def worker(w: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            prompt = f"worker {w} request {i % 7}"
            want = expected.get(prompt)
            if want is None:
                want = expected[prompt] = reference(model, layers, prompt, 6)
            body = msgspec.json.encode(InferRequest(prompt=prompt, max_tokens=6))
            tally.sent += 1
            started = time.perf_counter()
            for attempt in range(client_attempts):
                try:
                    msg = await nc.request(subjects.infer(model), body, timeout=timeout)
                except (TimeoutError, NoRespondersError):
                    if attempt + 1 < client_attempts:
                        tally.client_retries += 1
                        continue
                    tally.lost += 1
                    break
                reply = _reply.decode(msg.data)
                tally.latencies_ms.append((time.perf_counter() - started) * 1000)
                if not reply.ok:
                    tally.errors += 1
                    code = reply.error.code if reply.error else "?"
                    tally.error_codes[code] = tally.error_codes.get(code, 0) + 1
                elif reply.output == want:
                    tally.ok += 1
                else:
                    tally.wrong += 1
                break

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return tally


@dataclass
class Load:
    """:func:`run_load` in the background, its tally readable while it runs."""

    tally: Tally
    stop: asyncio.Event
    task: asyncio.Task[Tally]

    async def answered(self, more: int, what: str) -> None:
        """Until ``more`` requests beyond those answered so far have been answered
        correctly. This is what a test waits for before or after a fault, instead of
        a length of time that a busy machine may fill with nothing."""
        goal = self.tally.ok + more

        def reached() -> bool:
            if self.task.done():
                self.task.result()  # a worker's exception, rather than a silent stall
                raise AssertionError(f"the load ended early: {self.tally}")
            return self.tally.ok >= goal

        await until(reached, f"{more} more answers ({what}); so far {self.tally}")

    async def finish(self) -> Tally:
        """Stop sending; every request already sent is seen through (retries included)."""
        self.stop.set()
        return await self.task


def start_load(
    nc: Client,
    model: str,
    layers: int,
    *,
    workers: int = 4,
    timeout: float = 3.0,
    client_attempts: int = 2,
) -> Load:
    """:func:`run_load` as a task, until :meth:`Load.finish`."""
    tally, stop = Tally(), asyncio.Event()
    task = asyncio.create_task(
        run_load(
            nc,
            model,
            layers,
            stop,
            workers=workers,
            timeout=timeout,
            client_attempts=client_attempts,
            tally=tally,
        )
    )
    return Load(tally=tally, stop=stop, task=task)
