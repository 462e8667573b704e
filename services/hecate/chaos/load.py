"""A steady, bounded load that checks every answer, and the figures of one scenario.

Each of ``workers`` callers sends one request at a time through :class:`HecateClient`
(retries with Retry-After and jitter, as a real caller would) and records when it
started and ended and what came back:

* ``ok``: the answer equals the reference computation for the model that answered (the
  toy network is deterministic; a degraded answer is checked against the reserve);
* ``wrong``: any other answer;
* ``error``: an explicit error reply from the swarm (or the client's own breaker);
* ``lost``: no reply at all, after every attempt (``client_timeout``/``client_no_router``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from nats.aio.client import Client

from hecate.client import HecateClient
from hecate.wire.messages import InferReply

NO_REPLY = {"client_timeout", "client_no_router"}


@dataclass(frozen=True)
class Sample:
    started: float  # monotonic seconds
    ended: float
    status: str  # ok | wrong | error | lost
    code: str = ""
    nodes: tuple[str, ...] = ()  # the route that answered

    @property
    def latency_ms(self) -> float:
        return (self.ended - self.started) * 1000


@dataclass
class Record:
    samples: list[Sample] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)  # (when, what)
    checks: dict[str, bool] = field(default_factory=dict)  # scenario-specific findings
    notes: dict[str, float] = field(default_factory=dict)  # and the figures behind them

    def share_via(self, node: str, start: float, end: float) -> float:
        """The fraction of answers started in [start, end) whose route used ``node``."""
        answered = [s for s in self.samples if start <= s.started < end and s.nodes]
        if not answered:
            return 0.0
        return sum(1 for s in answered if node in s.nodes) / len(answered)

    def fault(self, what: str) -> None:
        self.faults.append((time.monotonic(), what))


Check = Callable[[str, InferReply], bool]  # (prompt, reply) -> is the answer right?


def prompt(worker: int, i: int) -> str:
    return f"chaos worker {worker} request {i % 5}"


def prompts(workers: int) -> list[str]:
    """Every prompt the load sends."""
    return sorted({prompt(w, i) for w in range(workers) for i in range(5)})


async def run_load(
    nc: Client,
    model: str,
    check: Check,
    stop: asyncio.Event,
    record: Record,
    *,
    workers: int = 4,
    max_tokens: int = 6,
    timeout_s: float = 2.0,
    max_attempts: int = 4,
) -> None:
    client = HecateClient(nc, timeout_s=timeout_s, max_attempts=max_attempts)

    async def worker(w: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            text = prompt(w, i)
            started = time.monotonic()
            reply = await client.infer(model, text, max_tokens=max_tokens)
            ended = time.monotonic()
            if reply.ok:
                status = "ok" if check(text, reply) else "wrong"
                nodes = tuple(s.node_id for s in reply.route.stages) if reply.route else ()
                record.samples.append(Sample(started, ended, status, nodes=nodes))
            else:
                code = reply.error.code if reply.error else "?"
                status = "lost" if code in NO_REPLY else "error"
                record.samples.append(Sample(started, ended, status, code))

    await asyncio.gather(*(worker(w) for w in range(workers)))


def summarize(scenario: str, record: Record) -> dict[str, Any]:
    """One line of figures: counts, the p99 latency while the fault lasted, and how long
    after the first fault the service looked normal again (``recover_s``: the end of the
    last request that failed or took more than 3x the pre-fault p99, 0 if none did)."""
    samples = record.samples
    first_fault = record.faults[0][0] if record.faults else float("inf")
    before = [s.latency_ms for s in samples if s.ended < first_fault and s.status == "ok"]
    baseline = float(np.percentile(before, 99)) if before else 50.0
    slow = max(3 * baseline, baseline + 50)
    bad_ends = [
        s.ended
        for s in samples
        if s.started >= first_fault - 10
        and s.ended >= first_fault
        and (s.status != "ok" or s.latency_ms > slow)
    ]
    recover_s = max(bad_ends) - first_fault if bad_ends else 0.0
    window_end = first_fault + max(recover_s, 1.0)
    during = [s.latency_ms for s in samples if first_fault <= s.ended and s.started <= window_end]
    codes: dict[str, int] = {}
    for s in samples:
        if s.code:
            codes[s.code] = codes.get(s.code, 0) + 1
    count = {k: sum(1 for s in samples if s.status == k) for k in ("ok", "wrong", "error", "lost")}
    return {
        "scenario": scenario,
        "sent": len(samples),
        "ok": count["ok"],
        "errors": count["error"],
        "lost": count["lost"],
        "wrong": count["wrong"],
        "p99_ms": round(float(np.percentile(during, 99)), 1) if during else 0.0,
        "max_ms": round(max(during), 1) if during else 0.0,
        "recover_s": round(recover_s, 2),
        "baseline_p99_ms": round(baseline, 1),
        "error_codes": codes,
        "faults": [what for _, what in record.faults],
        "checks": record.checks,
        "notes": record.notes,
    }
