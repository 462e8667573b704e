"""The many-users part of ``hecate bench llm`` (``--concurrency 1,2,4,8,16``): the swarm
``make run`` starts, N users generating at once, in rounds.

The swarm is ``hecate up --topology examples/smollm2.json``'s, process for process
(:func:`hecate.launch.plan_commands`: telemetry, the planner, the breaker service, two
routers with ``--dispatch chain``, six nodes making two 3-stage pipelines of SmolLM2),
each started with the command ``hecate up`` gives it on an embedded nats-server with
its ``max_payload``; nothing is tuned for the benchmark. Logs go to files in the run's
temporary folder.

At each level N, N users send at once, each through a :class:`HecateClient` of its own
(as a person would: it streams the tokens back on its own request's inbox, honours a
refusal's Retry-After and sends at most the SDK's default number of times), each send
given up after :func:`hecate.dev.bench.concurrency.deadline_s`.
A user is lost when its last send got no reply at all, and an error when the swarm's
last word was an error reply (:func:`hecate.dev.chaos.acceptance.classify`). Each user has
its own prompt (:data:`hecate.dev.bench.concurrency.PROMPTS`) and asks for the same number
of tokens. The right text for each prompt is computed once, before the swarm starts,
in this process on the engine (:func:`hecate.llm.reference.greedy_text`, one
request at a time by construction); an answer whose text as replied or as streamed
differs is counted wrong. Levels run in every round, their order rotated each round;
the figures are :mod:`hecate.dev.bench.concurrency`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from hecate.bus.server import NatsServer
from hecate.client import HecateClient
from hecate.client.sdk import MAX_ATTEMPTS, Attempt
from hecate.dev.bench.concurrency import (
    PROMPTS,
    Generation,
    deadline_s,
    failed_checks,
    level_figures,
    order,
    over_rounds,
    prompts_for,
    verdicts,
)
from hecate.dev.bench.results_llm import Users
from hecate.dev.chaos.acceptance import classify
from hecate.launch import Supervisor, node_env, plan_commands
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest, StreamToken

MODEL = "smollm2-135m"
TOPOLOGY = "smollm2.json"  # examples/smollm2.json, shipped beside the chaos scenarios
REFERENCE = "in this process on the nodes' engine, before the swarm starts"
_reply = msgspec.json.Decoder(InferReply)


@contextlib.contextmanager
def make_run_swarm(workdir: Path) -> Iterator[str]:
    """The swarm of ``make run`` (see the module's docstring), started in ``workdir``;
    yields its NATS URL, and stops every process (SIGTERM, then SIGKILL) and the server
    on the way out."""
    from hecate.dev.chaos.scenarios import topology

    path = workdir / TOPOLOGY
    path.write_bytes(topology(TOPOLOGY))
    env = node_env(dict(os.environ, HECATE_LOG_LEVEL="WARNING", HECATE_STATE=str(workdir)))
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    server = NatsServer(workdir / "nats", max_payload=1024 * 1024).start()
    swarm = Supervisor(env=env, logs=workdir)
    try:
        shape = argparse.Namespace(topology=str(path), strategy="greedy", pipelines=2, routers=2)
        for spec in plan_commands(shape, server.url):
            swarm.start(spec)
        yield server.url
    finally:
        swarm.stop()
        server.stop()


async def _send(
    nc: Client, prompt: str, tokens: int, wait_s: float
) -> tuple[float, float | None, InferReply | str]:
    """One bare request (no retry): when it was sent, when its reply came (None: not by
    ``wait_s``) and the reply, or the bus's own error code when nobody listened."""
    body = InferRequest(prompt=prompt, max_tokens=tokens, request_id=uuid.uuid4().hex)
    sent = time.perf_counter()
    try:
        msg = await nc.request(subjects.infer(MODEL), msgspec.json.encode(body), timeout=wait_s)
    except NatsTimeout:
        return sent, None, "lost"
    except NoRespondersError:
        return sent, time.perf_counter(), "no_responders"
    return sent, time.perf_counter(), _reply.decode(msg.data)


async def _user(nc: Client, prompt: str, tokens: int, expected: str, wait_s: float) -> Generation:
    """One user: a client of its own (its own breaker, as separate people have) on the
    shared connection, streaming its tokens; what it saw."""
    client = HecateClient(nc, timeout_s=wait_s, max_attempts=MAX_ATTEMPTS)
    texts: dict[int, str] = {}
    first: list[float] = []
    sends: list[Attempt] = []

    def on_token(token: StreamToken) -> None:
        if not first:
            first.append(time.perf_counter())
        texts[token.index] = token.text

    sent = time.perf_counter()
    reply = await client.infer(
        MODEL, prompt, max_tokens=tokens, on_token=on_token, on_attempt=sends.append
    )
    ended = time.perf_counter()
    code = "" if reply.ok else reply.error.code if reply.error else "internal"
    streamed = "".join(texts[i] for i in sorted(texts))
    right = reply.ok and reply.output == expected and streamed == expected
    status, filed = classify(reply.ok, right, sends, code)
    return Generation(
        sent,
        None if status == "lost" else ended,
        first[0] if first else None,
        len(texts),
        filed if status == "error" else "",
        right or not reply.ok,
        sends=len(sends),
    )


async def run_level(
    nc: Client, prompts: Sequence[str], tokens: int, expected: dict[str, str], wait_s: float
) -> list[Generation]:
    """``len(prompts)`` users at once, one prompt each; what each one saw."""
    return list(await asyncio.gather(*(_user(nc, p, tokens, expected[p], wait_s) for p in prompts)))


async def _warm(nc: Client, pipelines: int = 2, timeout_s: float = 600.0) -> list[str]:
    """Until the swarm answers, and each pipeline has answered once (its nodes have run
    a step: nothing is cold when timing starts): the pipelines seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen: set[str] = set()
    while len(seen) < pipelines and loop.time() < deadline:
        gens = await asyncio.gather(
            *(
                _send(nc, PROMPTS[i], 2, 30.0)
                for i in range(pipelines)  # at once: the routers spread them
            )
        )
        answered = [r for _, _, r in gens if isinstance(r, InferReply) and r.ok]
        seen |= {r.route.pipeline_id for r in answered if r.route is not None}
        if not answered:
            await asyncio.sleep(0.2)  # still starting: nobody to wait for but time
    if not seen:
        raise RuntimeError(f"the swarm did not answer within {timeout_s:.0f} s")
    return sorted(seen)


def _say(line: str) -> None:
    print(f"hecate bench llm: {line}", file=sys.stderr, flush=True)


def run_concurrency(path: Path, levels: Sequence[int], tokens: int, rounds: int) -> Users:
    """Every level in every round on a fresh ``make run`` swarm; the figures, verdicts
    and failed text checks (see :mod:`hecate.dev.bench.concurrency`)."""
    from hecate.llm.reference import greedy_text

    needed = sorted({p for r in range(rounds) for n in levels for p in prompts_for(n, r)})
    expected = {p: greedy_text(path, p, tokens) for p in needed}
    saved: list[dict[str, Any]] = []

    async def measure(url: str) -> list[str]:
        nc = await nats.connect(url, name="hecate-bench-users")
        try:
            warm = await _warm(nc)
            for r in range(rounds):
                turn = order(levels, r)
                rnd: dict[str, Any] = {"order": turn, "levels": {}}
                for n in turn:
                    gens = await run_level(
                        nc, prompts_for(n, r), tokens, expected, deadline_s(n, tokens)
                    )
                    figures = level_figures(gens)
                    rnd["levels"][str(n)] = figures
                    _say(
                        f"round {r + 1}, {n} at once: {figures['answered']}/{n} answered, "
                        f"{figures['aggregate_tokens_per_s']} tokens/s, "
                        f"TTFT p99 {figures['ttft_p99_ms']} ms"
                    )
                saved.append(rnd)
            return warm
        finally:
            await nc.close()

    with (
        tempfile.TemporaryDirectory(prefix="hecate-bench-users-") as tmp,
        make_run_swarm(Path(tmp)) as url,
    ):
        warm = asyncio.run(measure(url))
    users = {
        "levels": over_rounds(saved),
        "verdicts": verdicts(saved),
        "failed_checks": failed_checks(saved),
        "rounds": saved,
        "meta": {
            "levels": list(levels),
            "tokens": tokens,
            "rounds": rounds,
            "prompts": len(PROMPTS),
            "reference": REFERENCE,
            "deadline_s": {str(n): deadline_s(n, tokens) for n in levels},
            "swarm": "hecate up --topology examples/smollm2.json",
            "warmed_pipelines": warm,
        },
    }
    return msgspec.convert(users, Users)
