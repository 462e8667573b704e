"""``hecate bench wan``: SmolLM2 across the swarm when every node is far from the bus.

Each node process is given a fault proxy's URL (:mod:`hecate_dev.chaos.proxy`) instead
of the nats-server's, the proxy adding ``rtt/2`` each way; the router, telemetry and
the client stay next to the server. Two parts:

* **hop against chain**: the 3-stage swarm of ``hecate bench llm``
  (:func:`hecate_dev.bench.llm_swarm.serving`), once with ``--dispatch hop`` (the
  router calls each stage: every stage costs the router a round trip over that node's
  link) and once with ``--dispatch chain`` (each node forwards to the next: a forward
  crosses the sender's link and the receiver's). At each round-trip time, rounds
  interleaved, one streamed greedy generation per round; the median round's tokens/s.
* **the router's preference**: two 3-stage pipelines, the first (the one a tie goes to,
  by its id) with every node ``preference_rtt_ms`` further away; ``requests``
  sequential generations after ``warmup`` uncounted ones, and the share the router sent
  to the nearer pipeline, judged against
  :data:`hecate_dev.bench.report.wan.PREFERENCE_TARGET`.

Every generation is checked against the single-process greedy text; a wrong one is
listed in ``failed_checks``, which fails the command after the result is saved.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import os
import platform
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import urlsplit

import msgspec
import numpy as np

from hecate.llm.gguf_model import prepare
from hecate.llm.reference import greedy_text
from hecate.llm.store import pull
from hecate_dev.bench.llm_single import MODEL, PROMPT
from hecate_dev.bench.llm_swarm import _generate, serving
from hecate_dev.bench.report.wan import PREFERENCE_TARGET, judge_preference
from hecate_dev.bench.results_wan import WanMeta, WanPreference, WanResult, WanRun
from hecate_dev.chaos.proxy import FaultProxy, ProxyThread

RTTS_MS: tuple[float, ...] = (0.0, 20.0, 40.0)
DISPATCHES = ("hop", "chain")
BLAS_THREADS = 2  # as hecate bench llm's swarm runs
THREE = [("s0", 0, 10), ("s1", 10, 20), ("s2", 20, 30)]
# The far pipeline is r0: a tie between the two goes to it, so a preference measured
# is one the router made, not its tie-break.
FAR = [("far-0", 0, 10), ("far-1", 10, 20), ("far-2", 20, 30)]
NEAR = [("near-0", 0, 10), ("near-1", 10, 20), ("near-2", 20, 30)]
FAR_PIPELINE, NEAR_PIPELINE = f"{MODEL}-r0", f"{MODEL}-r1"


@contextmanager
def _proxied() -> Iterator[tuple[dict[str, FaultProxy], Callable[[str, str], str]]]:
    """Proxies made on demand, one per node, each to the server it is given."""
    thread = ProxyThread()
    proxies: dict[str, FaultProxy] = {}

    def node_url(node: str, server_url: str) -> str:
        where = urlsplit(server_url)
        assert where.hostname is not None
        assert where.port is not None
        proxies[node] = thread.start_proxy([(where.hostname, where.port)])
        return proxies[node].url

    try:
        yield proxies, node_url
    finally:
        thread.stop()


def _delay(proxies: Sequence[FaultProxy], rtt_ms: float) -> None:
    async def apply() -> None:
        for proxy in proxies:
            await proxy.set(latency_ms=rtt_ms / 2)

    asyncio.run(apply())


def _timed(url: str, tokens: int, expected: str) -> tuple[dict[str, float], str]:
    """One streamed generation: its figures, and its text if it was not ``expected``
    (what it replied and what it streamed must both be)."""
    t0, first, stamps, _, reply, streamed = asyncio.run(_generate(url, tokens))
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    figures = {
        "ttft_ms": round((first - t0) * 1000, 1),
        "tokens_per_s": round((len(stamps) - 1) / (stamps[-1] - first), 2)
        if len(stamps) > 1
        else 0.0,
        "gap_ms": round(float(np.median(gaps)) * 1000, 1) if gaps else 0.0,
    }
    text = reply.output or ""
    wrong = next((t for t in (text, streamed) if t != expected), "")
    return figures, wrong


def _dispatch(
    dispatch: str, rtts: Sequence[float], tokens: int, rounds: int, expected: str
) -> list[WanRun]:
    by_rtt: dict[float, list[tuple[dict[str, float], str]]] = {rtt: [] for rtt in rtts}
    with (
        _proxied() as (proxies, node_url),
        serving([THREE], dispatch=dispatch, blas_threads=BLAS_THREADS, node_url=node_url) as url,
    ):
        for _ in range(rounds):
            for rtt in rtts:
                _delay(list(proxies.values()), rtt)
                by_rtt[rtt].append(_timed(url, tokens, expected))
    runs = []
    for rtt, measured in by_rtt.items():
        median = sorted(measured, key=lambda m: m[0]["tokens_per_s"])[len(measured) // 2][0]
        wrong = next((text for _, text in measured if text), None)
        runs.append(
            WanRun(
                rtt_ms=rtt,
                dispatch=dispatch,
                tokens_per_s=median["tokens_per_s"],
                rounds_tokens_per_s=[m["tokens_per_s"] for m, _ in measured],
                ttft_ms=median["ttft_ms"],
                gap_ms=median["gap_ms"],
                text_ok=wrong is None,
                text=wrong,
            )
        )
    return runs


def _preference(
    rtt_ms: float, requests: int, warmup: int, tokens: int, expected: str
) -> WanPreference:
    on: dict[str, int] = {}
    ok = True
    with (
        _proxied() as (proxies, node_url),
        serving([FAR, NEAR], dispatch="chain", blas_threads=BLAS_THREADS, node_url=node_url) as url,
    ):
        _delay([p for node, p in proxies.items() if node.startswith("far-")], rtt_ms)
        for i in range(warmup + requests):
            _, _, _, _, reply, streamed = asyncio.run(_generate(url, tokens))
            ok = ok and reply.output == expected and streamed == expected
            if i >= warmup:
                pipeline = reply.route.pipeline_id if reply.route else "none"
                on[pipeline] = on.get(pipeline, 0) + 1
    counted = WanPreference(
        rtt_ms=rtt_ms,
        slow_pipeline=FAR_PIPELINE,
        fast_pipeline=NEAR_PIPELINE,
        requests=requests,
        warmup=warmup,
        on_fast=on.get(NEAR_PIPELINE, 0),
        on_slow=on.get(FAR_PIPELINE, 0),
        tokens=tokens,
        text_ok=ok,
        target_share=PREFERENCE_TARGET,
    )
    met, share = judge_preference(counted)
    return msgspec.structs.replace(counted, share_fast=share, met=met)


def run_wan_bench(
    *,
    tokens: int = 32,
    rounds: int = 3,
    rtts: Sequence[float] = RTTS_MS,
    requests: int = 16,
    warmup: int = 4,
    preference_tokens: int = 8,
    preference_rtt_ms: float = 40.0,
) -> WanResult:
    path = pull(MODEL, progress=lambda line: print(line, file=sys.stderr))
    prepare(path, float32=True)  # once, before the node processes would each build it
    expected = greedy_text(path, PROMPT, tokens)
    runs = [r for d in DISPATCHES for r in _dispatch(d, rtts, tokens, rounds, expected)]
    short = greedy_text(path, PROMPT, preference_tokens)
    preference = _preference(preference_rtt_ms, requests, warmup, preference_tokens, short)
    failed = [f"{r.dispatch} at {r.rtt_ms:g} ms: wrong text" for r in runs if not r.text_ok]
    if not preference.text_ok:
        failed.append("preference: wrong text")
    return WanResult(
        runs=runs,
        preference=preference,
        failed_checks=failed,
        meta=WanMeta(
            tokens=tokens,
            rounds=rounds,
            node_blas_threads=BLAS_THREADS,
            prompt=PROMPT,
            python=platform.python_version(),
            machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
            date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            text=expected,
        ),
    )
