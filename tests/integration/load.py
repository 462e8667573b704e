"""A bounded load generator that checks every answer against the reference."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError, TimeoutError

from hecate.model import reference
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest

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
) -> Tally:
    """Each worker sends one request at a time until ``stop``. A request with no reply
    within ``timeout`` is re-sent (as any NATS client would) up to ``client_attempts``
    times; only then is it counted lost."""
    tally = Tally()
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
