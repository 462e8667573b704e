"""The many-users part of ``hecate bench llm`` (``--concurrency 1,2,4,8,16,32``): the
swarm ``make run`` starts, N users generating at once through its gateway, in rounds,
beside one process batching 16 sessions of the same prompts in the same rounds.

The swarm is ``hecate up --topology examples/smollm2.json``'s, process for process
(:func:`hecate_dev.bench.gateway_swarm.standing`: telemetry, the planner, the breaker
service, two routers with ``--dispatch chain``, six nodes making two 3-stage pipelines
of SmolLM2, and the OpenAI-compatible gateway), each started with the command ``hecate
up`` gives it on an embedded nats-server with its ``max_payload``; nothing is tuned for
the benchmark. Logs go to files in the run's temporary folder.

At each level N, N users send at once, each through an official ``openai`` client of its
own (``AsyncOpenAI``, as an application would: its own connection pool, its own
retries, which honour a refusal's Retry-After), streaming a completion of its prompt
(``/v1/completions``, greedy, ``max_tokens`` tokens, usage included), each given up
after :func:`hecate_dev.bench.concurrency.deadline_s`. Every HTTP request a client sends
is counted (``resent``: beyond its first). A user is lost when its client got no answer
at all (it timed out, or the connection failed), and an error when the gateway's last
word was an error (an HTTP error status, or an error event in the stream), filed under
its code. Each user has its own prompt (:data:`hecate_dev.bench.concurrency.PROMPTS`).
The right text for each prompt is computed once, before the swarm starts, in this
process on the engine (:func:`hecate.llm.reference.greedy_text`, one request at a time
by construction); an answer whose streamed text differs is counted wrong.

Each round first runs the one-process baseline, while the swarm stands idle: the 16
prompts of that round's 16-user level generated together in a fresh interpreter, the
whole model on the engine on every core, batched
(:func:`hecate_dev.bench.llm_single.batched`), its texts checked like the swarm's. Then
every level, their order rotated each round; the figures are
:mod:`hecate_dev.bench.concurrency`'s. Around each level, the CPU time of every process
of the swarm and of this one (the users' clients, which share the cores) is read from
``/proc``: milliseconds of CPU per answered token, by part (:func:`cpu_per_token`).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import openai

from hecate.client.sdk import MAX_ATTEMPTS
from hecate_dev.bench.concurrency import (
    BASELINE_SESSIONS,
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
from hecate_dev.bench.gateway_swarm import (
    Standing,
    bench_env,
    cpu_s,
    role,
    standing,
    wait_serving,
)
from hecate_dev.bench.llm_single import in_process
from hecate_dev.bench.results_llm import Users
from hecate_launcher import node_env

MODEL = "smollm2-135m"
TOPOLOGY = "smollm2.json"  # examples/smollm2.json, shipped beside the chaos scenarios
REFERENCE = "in this process on the nodes' engine, before the swarm starts"
VIA = "the gateway, each user an official openai AsyncOpenAI client streaming /v1/completions"
BASELINE = (
    "the whole model on the engine on every core (spinning threads), the 16-user level's "
    "16 prompts as 16 sessions, prefilled in one batch, then one batched decode step a "
    "token"
)


def _error_code(exc: openai.APIError) -> str:
    """The swarm's code in an OpenAI error body (``{"code": ...}``), else its type."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("code"):
            return str(inner["code"])
    return str(exc.code or exc.type or type(exc).__name__)


async def _user(base: str, prompt: str, tokens: int, expected: str, wait_s: float) -> Generation:
    """One user: an ``openai`` client of its own streaming one completion; what it saw."""
    sends = 0

    async def count(_request: object) -> None:
        nonlocal sends
        sends += 1

    # The client's own HTTP client (whatever httpx it is built on), counting its sends.
    http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [count]}, timeout=wait_s)
    client = openai.AsyncOpenAI(
        base_url=f"{base}/v1",
        api_key="bench",  # the bench's gateway is --open
        http_client=http,
        max_retries=MAX_ATTEMPTS - 1,
        timeout=wait_s,
    )
    parts: list[str] = []
    first: float | None = None
    generated = 0
    code = ""
    sent = time.perf_counter()
    replied: float | None = None
    try:
        async with asyncio.timeout(wait_s):
            stream = await client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                text = chunk.choices[0].text if chunk.choices else ""
                if text:
                    first = first or time.perf_counter()
                    parts.append(text)
                if chunk.usage is not None:
                    generated = chunk.usage.completion_tokens
        replied = time.perf_counter()
    except (openai.APITimeoutError, openai.APIConnectionError, TimeoutError):
        replied = None  # no answer: lost
    except openai.APIError as exc:  # an error status, or an error event in the stream
        replied, code = time.perf_counter(), _error_code(exc)
    finally:
        await client.close()
    text = "".join(parts)
    return Generation(
        sent,
        replied,
        first,
        generated,
        code,
        text_ok=bool(code) or replied is None or text == expected,
        sends=max(1, sends),
    )


async def run_level(
    base: str, prompts: Sequence[str], tokens: int, expected: dict[str, str], wait_s: float
) -> list[Generation]:
    """``len(prompts)`` users at once, one prompt each; what each one saw."""
    users = (_user(base, p, tokens, expected[p], wait_s) for p in prompts)
    return list(await asyncio.gather(*users))


USERS = "users' clients"  # the bench process: the openai clients, on the same cores


def _cpu(st: Standing) -> dict[str, float]:
    """CPU seconds so far of every process of the swarm, and of this one (the users)."""
    return {**{label: cpu_s(pid) for label, pid in st.pids.items()}, USERS: time.process_time()}


def cpu_per_token(
    before: dict[str, float], after: dict[str, float], tokens: int
) -> dict[str, float]:
    """Milliseconds of CPU per answered token, by part of the swarm (nodes, routers,
    gateway, nats-server, other services) and for the users' clients, between two
    readings; empty when nothing was answered."""
    if tokens <= 0:
        return {}
    used: dict[str, float] = {}
    for label, start in before.items():
        part = USERS if label == USERS else role(label)
        used[part] = used.get(part, 0.0) + after.get(label, start) - start
    return {part: round(s * 1000 / tokens, 3) for part, s in sorted(used.items())}


def one_process(prompts: Sequence[str], tokens: int, expected: dict[str, str]) -> dict[str, Any]:
    """The baseline: ``prompts`` batched in one fresh process (see the module's
    docstring); its figures and how many of its texts were wrong."""
    got = in_process(f"batched(path, {list(prompts)!r}, {tokens})", {})
    texts = got.pop("texts")
    got["wrong"] = sum(t != expected[p] for p, t in zip(prompts, texts, strict=True))
    return dict(got)


async def _warm(base: str, pipelines: int = 2, timeout_s: float = 600.0) -> None:
    """Every pipeline has run a generation (its nodes have run a step: nothing is cold
    when timing starts): as many users at once as there are pipelines, twice (the
    routers spread users at once over the pipelines)."""
    for _ in range(2):
        await run_level(base, PROMPTS[:pipelines], 2, dict.fromkeys(PROMPTS, ""), timeout_s)


def _say(line: str) -> None:
    print(f"hecate bench llm: {line}", file=sys.stderr, flush=True)


def run_concurrency(path: Path, levels: Sequence[int], tokens: int, rounds: int) -> Users:
    """Every level in every round on a fresh ``make run`` swarm with its gateway, after
    the round's one-process baseline; the figures, verdicts and failed text checks (see
    :mod:`hecate_dev.bench.concurrency`)."""
    from hecate.llm.reference import greedy_text
    from hecate_dev.chaos.scenarios import topology

    baselines = [prompts_for(BASELINE_SESSIONS, r) for r in range(rounds)]
    needed = sorted(
        {p for r in range(rounds) for n in levels for p in prompts_for(n, r)}
        | {p for b in baselines for p in b}
    )
    expected = {p: greedy_text(path, p, tokens) for p in needed}
    saved: list[dict[str, Any]] = []

    async def measure(st: Standing) -> None:
        base = st.base
        await _warm(base)
        for r in range(rounds):
            turn = order(levels, r)
            one = one_process(baselines[r], tokens, expected)
            _say(
                f"round {r + 1}, one process, {one['sessions']} sessions: "
                f"{one['aggregate_tokens_per_s']} tokens/s, {one['wrong']} wrong"
            )
            rnd: dict[str, Any] = {"order": turn, "levels": {}, "one_process": one, "cpu": {}}
            for n in turn:
                before = _cpu(st)
                gens = await run_level(
                    base, prompts_for(n, r), tokens, expected, deadline_s(n, tokens)
                )
                figures = level_figures(gens)
                rnd["levels"][str(n)] = figures
                rnd["cpu"][str(n)] = cpu_per_token(before, _cpu(st), figures["tokens"])
                _say(
                    f"round {r + 1}, {n} at once: {figures['answered']}/{n} answered, "
                    f"{figures['aggregate_tokens_per_s']} tokens/s, "
                    f"TTFT p99 {figures['ttft_p99_ms']} ms"
                )
            saved.append(rnd)

    with tempfile.TemporaryDirectory(prefix="hecate-bench-users-") as tmp:
        work = Path(tmp)
        (work / TOPOLOGY).write_bytes(topology(TOPOLOGY))
        env = node_env(bench_env(HECATE_STATE=str(work)))  # as hecate up runs them
        with standing(work, work / TOPOLOGY, env) as st:
            wait_serving(st, MODEL, 600.0)
            asyncio.run(measure(st))
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
            "via": VIA,
            "one_process": BASELINE,
        },
    }
    return msgspec.convert(users, Users)
