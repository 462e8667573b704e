"""A steady, bounded load that checks every answer, and the figures of one scenario.

Each of ``workers`` callers sends one request at a time through :class:`HecateClient`
(retries with Retry-After and jitter, and hedged sends, as a real caller would) and
records when it
started and ended and what came back:

* ``ok``: the answer equals the reference computation for the model that answered (the
  toy network is deterministic; a degraded answer is checked against the reserve, and
  counted apart);
* ``wrong``: any other answer;
* ``error``: the swarm's last word was an explicit error reply;
* ``lost``: the last send got no reply at all, whatever the client decided afterwards
  (its breaker refusing further sends does not make silence an error).

See :mod:`hecate_dev.chaos.acceptance` for how these figures are judged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from nats.aio.client import Client

from hecate.client import HecateClient
from hecate.client.sdk import Attempt
from hecate.wire.messages import InferReply, StreamToken
from hecate_dev.chaos.acceptance import answered_during, classify, degraded_while_intact


@dataclass(frozen=True)
class Sample:
    started: float  # monotonic seconds
    ended: float
    status: str  # ok | wrong | error | lost
    code: str = ""
    nodes: tuple[str, ...] = ()  # the route that answered
    degraded: bool = False  # answered by the reserve model
    sends: int = 1  # attempts that went out on the wire
    hedges: int = 0  # of those, sent while an earlier one was still outstanding
    # Why each send that was not answered failed (an error's code, or the client's own
    # for silence), the retried ones too: a fault a retry absorbed is still a failure
    # to judge. A hedge made moot by another send's answer is not one.
    failed_sends: tuple[str, ...] = ()

    @property
    def latency_ms(self) -> float:
        return (self.ended - self.started) * 1000


@dataclass
class Record:
    samples: list[Sample] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)  # (when, what)
    checks: dict[str, bool] = field(default_factory=dict)  # scenario-specific findings
    notes: dict[str, float] = field(default_factory=dict)  # and the figures behind them
    # The base model's pipelines when the load began, and each node the scenario hurt
    # (from when): an answer from the reserve beside an intact pipeline is a failure.
    pipelines: list[tuple[str, ...]] = field(default_factory=list)
    impaired: dict[str, float] = field(default_factory=dict)
    # Parts off the request path taken down, (from, to): traffic must flow through them.
    outages: list[tuple[float, float]] = field(default_factory=list)
    failover_events: int = 0
    # With a streaming load: when each token arrived (monotonic), across all callers.
    tokens: list[float] = field(default_factory=list)
    # Telemetry's verdicts while the load ran: (when, node id, "down" | "up").
    node_events: list[tuple[float, str, str]] = field(default_factory=list)

    def share_via(self, node: str, start: float, end: float) -> float:
        """The fraction of answers started in [start, end) whose route used ``node``."""
        answered = [s for s in self.samples if start <= s.started < end and s.nodes]
        if not answered:
            return 0.0
        return sum(1 for s in answered if node in s.nodes) / len(answered)

    def fault(self, what: str) -> None:
        self.faults.append((time.monotonic(), what))

    def impair(self, node: str) -> None:
        self.impaired.setdefault(node, time.monotonic())


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
    stream: bool = False,
    prompt_of: Callable[[int, int], str] = prompt,
) -> None:
    """``workers`` callers until ``stop`` is set, each finishing the request it has in
    flight. ``stream``: each request streams its tokens, their arrival times go to
    ``record.tokens``, and an answer is right only if what streamed is what it says.
    ``prompt_of(worker, i)``: the prompt of a worker's i-th request."""
    client = HecateClient(nc, timeout_s=timeout_s, max_attempts=max_attempts)

    async def worker(w: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            text = prompt_of(w, i)
            sends: list[Attempt] = []
            streamed: dict[int, str] = {}

            def on_token(token: StreamToken, streamed: dict[int, str] = streamed) -> None:
                record.tokens.append(time.monotonic())
                streamed[token.index] = token.text

            started = time.monotonic()
            reply = await client.infer(
                model,
                text,
                max_tokens=max_tokens,
                on_attempt=sends.append,
                on_token=on_token if stream else None,
            )
            ended = time.monotonic()
            right = reply.ok and check(text, reply)
            if stream and right:
                right = "".join(streamed[k] for k in sorted(streamed)) == reply.output
            code = reply.error.code if reply.error else "?"
            status, filed = classify(reply.ok, right, sends, code)
            nodes = tuple(s.node_id for s in reply.route.stages) if reply.route else ()
            record.samples.append(
                Sample(
                    started,
                    ended,
                    status,
                    filed,
                    nodes=nodes if reply.ok else (),
                    degraded=reply.ok and reply.degraded,
                    sends=len(sends),
                    hedges=sum(1 for a in sends if a.hedge),
                    failed_sends=failed_sends(sends),
                )
            )

    await asyncio.gather(*(worker(w) for w in range(workers)))


def failed_sends(sends: Sequence[Attempt]) -> tuple[str, ...]:
    """The code of every send of one call that was not answered with an answer (the
    swarm's error, or the client's own code for silence), in order; a hedge another
    send's answer made moot is left out."""
    return tuple(
        a.code or ("client_no_reply" if not a.replied else "internal")
        for a in sends
        if a.code != "client_superseded" and not (a.replied and not a.code)
    )


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
    codes: dict[str, dict[str, int]] = {"error": {}, "lost": {}}
    for s in samples:
        if s.status in codes:
            codes[s.status][s.code] = codes[s.status].get(s.code, 0) + 1
    send_failures: dict[str, int] = {}
    for s in samples:
        for code in s.failed_sends:
            send_failures[code] = send_failures.get(code, 0) + 1
    count = {k: sum(1 for s in samples if s.status == k) for k in ("ok", "wrong", "error", "lost")}
    degraded = [s.ended for s in samples if s.degraded]
    evidence: dict[str, float] = {
        "failover_events": float(record.failover_events),
        "client_retries": float(sum(max(0, s.sends - 1) for s in samples)),
        "hedges": float(sum(s.hedges for s in samples)),
        "recover_s": round(recover_s, 2),
    }
    outage = answered_during(
        record.outages, ((s.started, s.ended) for s in samples if s.status == "ok")
    )
    if outage is not None:
        evidence["answered_during_outages"] = float(outage)
    return {
        "scenario": scenario,
        "sent": len(samples),
        "ok": count["ok"],
        "errors": count["error"],
        "lost": count["lost"],
        "wrong": count["wrong"],
        "degraded": len(degraded),
        "degraded_while_intact": degraded_while_intact(degraded, record.pipelines, record.impaired),
        "p99_ms": round(float(np.percentile(during, 99)), 1) if during else 0.0,
        "max_ms": round(max(during), 1) if during else 0.0,
        "recover_s": round(recover_s, 2),
        "baseline_p99_ms": round(baseline, 1),
        "error_codes": codes["error"],
        "lost_codes": codes["lost"],
        "send_failures": dict(sorted(send_failures.items())),
        "evidence": evidence,
        "faults": [what for _, what in record.faults],
        "checks": record.checks,
        "notes": record.notes,
    }
