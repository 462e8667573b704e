"""``hecate bench gateway``: what the HTTP gateway adds over asking the swarm on NATS.

The swarm is ``hecate up``'s for the topology, process for process
(:func:`hecate_launcher.plan_commands`), on an embedded nats-server, with ``hecate gateway
--open --port 0`` beside it as its own process, as in production. Nothing is tuned for
the benchmark. Two parts:

* **The toy model** (``examples/swarm.json``, ``make run-toy``'s swarm): the same
  ``/v1/completions`` asked directly on NATS (``hecate.infer.<model>``, the request the
  gateway itself would send) and through the gateway.

  - *Latency added*: one request at a time, the paths taking turns request by request
    (their order rotated), so a slow second of the machine falls on all of them. Over
    HTTP twice, each on one keep-alive connection: with
    :class:`hecate_dev.bench.gateway_load.Http1`, the least an HTTP client can do (the
    figure the targets judge: what the gateway adds, not what a client library costs),
    and with httpx, which the ``openai`` SDK is built on (what such a client sees;
    the gap between the two is httpx's own time, on the very same requests and
    answers). Added p50 and p99 are the differences of the paths' p50 and p99.
  - *Capacity*: ``processes`` worker processes keep N clients busy in a closed loop
    (:mod:`hecate_dev.bench.gateway_load`), N at each of ``clients``, on NATS directly and
    through the gateway in turn, for ``rounds`` rounds; each path's capacity is its
    best level's median round (``growing``: the most clients still gave over 10 %
    more than the level below, so it is only a floor), the ratio the median of the
    rounds' ratios of best levels. Every process's CPU over each window is read from
    ``/proc``, the workers' included: the report says where the time went and what
    the load cost.

* **SmolLM2 streaming** (only if ``smollm2-135m`` is pulled; never pulled here): ``make
  run``'s swarm (:mod:`hecate_dev.bench.gateway_stream`).

Every answer is checked against the direct answer for the same prompt; a wrong one is
listed in ``failed_checks`` (and fails the command after the result is saved).
Verdicts are :func:`hecate_dev.bench.report.gateway.judge`'s, from the figures alone, the
same the report gives.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import nats

from hecate.core import HecateError
from hecate_dev.bench.gateway_capacity import capacity as measure_capacity
from hecate_dev.bench.gateway_load import (
    TIMEOUT_S,
    Ask,
    Http1,
    ask_direct,
    completion_body,
    text_of_completion,
)
from hecate_dev.bench.gateway_swarm import Standing, bench_env, standing, wait_serving
from hecate_dev.bench.generators import run_on_uvloop
from hecate_dev.bench.openloop import percentile
from hecate_dev.bench.report.gateway import TARGETS_US, judge, said, wrong_answers
from hecate_dev.bench.results_gateway import GatewayResult

__all__ = ["QUICK", "Standing", "bench_env", "run_gateway_bench", "standing", "wait_serving"]

TOY_MODEL = "ncm-base"
TOY_TOPOLOGY = "examples/swarm.json"
TOY_TOKENS = 8
PROMPTS = 8  # distinct prompts, taken in turn
PATHS = ("direct", "gateway", "gateway_httpx")
# --quick: a smoke run, seconds not minutes; its figures are too few to judge by.
QUICK: dict[str, Any] = {
    "samples": 300,
    "warmup": 30,
    "clients": (64,),
    "seconds": 1.0,
    "rounds": 1,
    "stream_tokens": 16,
    "stream_rounds": 1,
}


def toy_topology() -> Path:
    """``examples/swarm.json`` of the source tree this runs from (``make bench`` runs in
    it), else of the working directory."""
    for root in (Path(__file__).resolve().parents[3], Path.cwd()):
        if (root / TOY_TOPOLOGY).is_file():
            return root / TOY_TOPOLOGY
    raise HecateError(f"bench gateway: no {TOY_TOPOLOGY} here (run it from the repository)")


# -- the toy model: latency ---------------------------------------------------------------
def asks(url: str, model: str, tokens: int, count: int) -> list[Ask]:
    """``count`` prompts with the text a direct request gets for each."""

    async def expected() -> list[Ask]:
        nc = await nats.connect(url)
        try:
            out = []
            for i in range(count):
                body = completion_body(model, f"through the front door, prompt {i}", tokens)
                text = await ask_direct(nc, Ask(model, body, ""))
                if text is None:
                    raise RuntimeError(f"the swarm did not answer prompt {i} directly")
                out.append(Ask(model, body, text))
            return out
        finally:
            await nc.close()

    result: list[Ask] = run_on_uvloop(expected())
    return result


def _figures(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50": round(percentile(ordered, 0.50) * 1e6, 1),
        "p99": round(percentile(ordered, 0.99) * 1e6, 1),
        "samples": len(ordered),
    }


async def _latency(st: Standing, todo: list[Ask], samples: int, warmup: int) -> dict[str, Any]:
    nc = await nats.connect(st.url)
    raw = await Http1.open(st.base)
    raws = [Http1.post_bytes(st.base, "/v1/completions", a.body) for a in todo]
    taken: dict[str, list[float]] = {p: [] for p in PATHS}
    wrong = dict.fromkeys(PATHS, 0)
    failed = dict.fromkeys(PATHS, 0)
    headers = {"content-type": "application/json"}
    try:
        async with httpx.AsyncClient(base_url=st.base, timeout=TIMEOUT_S) as hx:

            async def one(path: str, k: int) -> str | None:
                if path == "direct":
                    return await ask_direct(nc, todo[k])
                if path == "gateway":
                    status, body = await raw.send(raws[k])
                    return text_of_completion(body) if status == 200 else None
                r = await hx.post("/v1/completions", content=todo[k].body, headers=headers)
                return text_of_completion(r.content) if r.status_code == 200 else None

            for i in range(warmup + samples):
                k = i % len(todo)
                turn = i % len(PATHS)
                for path in PATHS[turn:] + PATHS[:turn]:
                    t0 = time.perf_counter()
                    text = await one(path, k)
                    took = time.perf_counter() - t0
                    if i < warmup:
                        continue
                    if text is None:
                        failed[path] += 1
                    elif text != todo[k].expected:
                        wrong[path] += 1
                    else:
                        taken[path].append(took)
    finally:
        await raw.close()
        await nc.close()
    out: dict[str, Any] = {f"{p}_us": _figures(taken[p]) for p in PATHS}
    for q in ("p50", "p99"):
        out[f"added_{q}_us"] = round(out["gateway_us"][q] - out["direct_us"][q], 1)
        out[f"added_{q}_us_httpx"] = round(out["gateway_httpx_us"][q] - out["direct_us"][q], 1)
    out["wrong"] = wrong
    out["failed"] = failed
    return out


def run_toy(
    *,
    samples: int,
    warmup: int,
    clients: tuple[int, ...],
    processes: int,
    seconds: float,
    rounds: int,
) -> dict[str, Any]:
    """The toy model's part: latency added, then capacities, on one standing swarm."""
    env = bench_env(OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp, standing(Path(tmp), toy_topology(), env) as st:
        wait_serving(st, TOY_MODEL, 120.0)
        todo = asks(st.url, TOY_MODEL, TOY_TOKENS, PROMPTS)
        latency = run_on_uvloop(_latency(st, todo, samples, warmup))
        capacity = (
            measure_capacity(
                st,
                todo,
                env,
                clients=clients,
                processes=processes,
                seconds=seconds,
                rounds=rounds,
            )
            if rounds
            else None
        )
    return {
        "model": TOY_MODEL,
        "topology": TOY_TOPOLOGY,
        "tokens": TOY_TOKENS,
        "prompts": PROMPTS,
        "latency": latency,
        "capacity": capacity,
    }


def run_gateway_bench(
    *,
    samples: int = 2000,
    warmup: int = 100,
    clients: tuple[int, ...] = (32, 128, 512),
    processes: int = 2,
    seconds: float = 4.0,
    rounds: int = 3,
    stream: bool = True,
    stream_tokens: int = 48,
    stream_rounds: int = 5,
) -> GatewayResult:
    """Both parts (``stream=False``: the toy model's only), the failed checks and the
    verdicts."""
    report: dict[str, Any] = {
        "toy": run_toy(
            samples=samples,
            warmup=warmup,
            clients=clients,
            processes=processes,
            seconds=seconds,
            rounds=rounds,
        )
    }
    if stream:
        from hecate_dev.bench.gateway_stream import run_stream

        report["stream"] = run_stream(tokens=stream_tokens, rounds=stream_rounds)
    else:
        report["stream"] = {"skipped": "not asked for (toy model only)"}
    result = msgspec.convert(report, GatewayResult)
    wrong = wrong_answers(result)
    return msgspec.structs.replace(
        result,
        failed_checks=[f"{wrong} wrong answers"] if wrong else [],
        verdicts={k: said(v) for k, v in judge(result).items()},
        targets_us=dict(TARGETS_US),
    )
