"""``hecate bench llm``: SmolLM2-135M generation, in one process and across the swarm.

One run measures, greedy, the same prompt and token count:

* ``single``: the nodes' engine (ONNX Runtime on the GGUF's own blocks) on the whole
  model in this process (no bus), every core, threads spinning between runs: its best
  case, as llama.cpp's;
* ``single_1_thread``: the same on one thread (the thread a node's stage computes on),
  in a fresh process, in every round beside ``single``; ``ratio_3_stages_1_thread_rounds``:
  ``stages_3`` over it per round, what chaining the stages costs one user when each
  step computes on the same thread as one process would;
* ``stages_1`` / ``stages_2`` / ``stages_3``: one router (``--dispatch chain``) and 1-3
  node processes (``--executor smollm2``, the engine) on an embedded nats-server, the
  plan written to KV directly. Nodes run the engine on ``blas_threads`` threads each
  (``HECATE_ENGINE_THREADS``; 1, as ``hecate up`` gives them: stages share the cores),
  threads that do not spin between runs. ``stages_3_hop``: the router calls
  each stage. ``stage_steps_*``: one
  10-block stage's step on the engine, at 1 and 2 threads, back to back and after a
  25 ms pause (the other stages' share of a token): the wake-up each stage pays;
* ``stages_3_secure``: ``stages_3`` on the bus as deployed: TLS, an account per tenant,
  every process its own user, the router taking the tenant from the account the server
  stamps (``--tenant-from bus``), the generation asked by a tenant from its own account.
  The two are timed side by side (:func:`hecate_dev.bench.llm_swarm.side_by_side`) after
  the rounds: a swarm on each bus, both standing at once, each warmed up with
  ``secure_warmup`` untimed generations, then ``secure_pairs`` pairs
  (:data:`SECURE_PAIRS`), one generation on each, which goes first alternating pair by
  pair; one generation's tokens/s spreads by more than the bus costs, hence many pairs
  on swarms that stay up. ``secure_runs``: every pair and each side's pooled tokens/s
  (all its tokens after the first over all its decoding time);
  ``secure_over_open_rounds``: the locked-down tokens/s over the open in each pair;
  ``secure_over_open``: their median; ``secure_over_open_met``: that against
  :data:`hecate_dev.bench.report.secure.LLM_TARGET_SECURE`; ``secure_over_open_pooled``:
  the pooled tokens/s of the two, over each other; ``stages_3_secure``: the median
  locked-down run;
* ``kill_between_steps`` / ``kill_mid_step``: two 3-stage pipelines; the middle node of
  the serving one is SIGKILLed after ``kill_after`` tokens, either as that token
  arrives (the victim is idle: the next step gets no-responders) or ~40 % into the next
  step (the victim is computing: the step dies with it, telemetry's node-down tells the
  router). ``kill_stall_ms`` is the longest gap between two streamed tokens (detection
  and the replay of the prompt and the tokens so far); ``failover_reason`` says which
  of the two it was;
* ``concurrency``: many users at once on the swarm ``make run`` starts (two 3-stage
  pipelines), at each level of ``--concurrency`` (default 1,2,4,8,16,32), in the same
  number of rounds, each user with its own prompt: answered, errors, lost, aggregate
  and per-user tokens/s, TTFT p50/p99, the text check and the verdicts
  (:mod:`hecate_dev.bench.llm_concurrency`, :mod:`hecate_dev.bench.concurrency`);
* ``llama_cpp``: the same GGUF under llama.cpp (llama-cpp-python, 2 threads, the
  dev tools' ``bench`` extra: ``pip install './devtools[bench]'``), fed the same prompt
  token ids and decoded greedy for the same number of tokens, timed in the same rounds as
  ``single`` (``ratio_single_llama_cpp_rounds``); its version and build flags are
  recorded beside it. Without the extra it says it was skipped and why.

Every timed generation is checked against the single-process greedy text
(:func:`hecate.llm.reference.greedy_text`): a run whose text differs carries
``text_ok: false`` and is listed in ``failed_checks``, which fails the command after the
result is saved: a fast wrong answer is not a figure. llama.cpp's text is only compared
(``matches_numpy_text``, against the engine's text since the engine became the nodes'
default): its kernels differ from the engine's, so near-ties may flip.

Time to first token (TTFT) includes the prompt's prefill; tokens/s counts the tokens
after the first; ``gap_ms`` is the median time between two tokens.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from hecate.llm.gguf_model import prepare
from hecate.llm.reference import greedy_text
from hecate.llm.store import pull
from hecate_dev.bench.concurrency import DEFAULT_LEVELS
from hecate_dev.bench.llm_concurrency import run_concurrency
from hecate_dev.bench.llm_single import (
    LLAMA_CPP_EXTRA,
    LLAMA_CPP_THREADS,
    MODEL,
    PROMPT,
    LlamaCpp,
    in_process,
    llama_cpp_build,
    single,
    single_one_thread,
    stage_steps,
)
from hecate_dev.bench.llm_swarm import side_by_side, swarm
from hecate_dev.bench.report.paired import median_ratio
from hecate_dev.bench.report.secure import judge_secure
from hecate_dev.bench.results_llm import LlmResult

__all__ = [
    "LLAMA_CPP_EXTRA",
    "LLAMA_CPP_THREADS",
    "MODEL",
    "PROMPT",
    "LlamaCpp",
    "check_text",
    "failed_checks",
    "in_process",
    "llama_cpp_build",
    "run_llm_bench",
    "secure_figures",
    "side_by_side",
    "single",
    "single_one_thread",
    "stage_steps",
    "swarm",
]


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: float(r["tokens_per_s"]))[len(runs) // 2]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _settle() -> None:
    """Between two in-process configurations: the one before leaves its BLAS or OpenMP
    threads spinning for a while, and they would take the cores the next one is timed on."""
    time.sleep(0.5)


def check_text(run: dict[str, Any], expected: str) -> dict[str, Any]:
    """``run`` with its text replaced by ``text_ok``: whether what it produced (and, for
    the swarm, what it streamed) is ``expected``. A wrong text is kept, to be read."""
    texts = [run.pop("text")]
    if "streamed_text" in run:
        texts.append(run.pop("streamed_text"))
    run["text_ok"] = all(t == expected for t in texts)
    if not run["text_ok"]:
        run["text"] = texts[0]
        if len(texts) > 1:
            run["streamed_text"] = texts[1]
    return run


def failed_checks(result: dict[str, Any]) -> list[str]:
    """Every timed generation of ``result`` whose text was wrong, by name."""
    rounds = result.get("rounds", [])
    pairs = result.get("secure_runs", {}).get("pairs", [])
    # The median round's runs and the median locked-down run are listed at the top as
    # well: named once, where they were timed.
    copies = {*(rounds[0] if rounds else {}), *(["stages_3_secure"] if pairs else [])}
    runs = [(k, v) for k, v in result.items() if isinstance(v, dict) and k not in copies]
    for i, rnd in enumerate(rounds):
        runs += [(f"{k} (round {i + 1})", v) for k, v in rnd.items()]
    for j, pair in enumerate(pairs):
        runs += [(f"{k} (pair {j + 1})", v) for k, v in pair.items() if isinstance(v, dict)]
    return sorted({f"{k}: wrong text" for k, v in runs if v.get("text_ok") is False})


def _rate(run: dict[str, Any]) -> float:
    return (run["tokens"] - 1) / run["decode_s"]


def secure_figures(pairs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """The locked-down bus against the open one from :func:`side_by_side`'s pairs (texts
    checked): each pair's ratio of tokens/s, their median, the pooled ratio, the median
    locked-down run and every pair (the result's fields, see the module)."""
    per_pair = [round(_rate(p["stages_3_secure"]) / _rate(p["stages_3"]), 3) for p in pairs]

    def pooled(side: str) -> float:
        runs = [p[side] for p in pairs]
        return sum(r["tokens"] - 1 for r in runs) / sum(r["decode_s"] for r in runs)

    open_rate, secure_rate = pooled("stages_3"), pooled("stages_3_secure")
    return {
        "stages_3_secure": _median_run([p["stages_3_secure"] for p in pairs]),
        "secure_over_open_rounds": per_pair,
        "secure_over_open": median_ratio(per_pair),
        "secure_over_open_pooled": round(secure_rate / open_rate, 3),
        "secure_runs": {
            "warmup": warmup,
            "pairs": pairs,
            "pooled_open_tokens_per_s": round(open_rate, 2),
            "pooled_secure_tokens_per_s": round(secure_rate, 2),
        },
    }


SECURE_PAIRS = 8  # open/locked-down pairs of 3-stage runs, both swarms standing
SECURE_WARMUP = 2  # untimed generations on each swarm before the pairs


def run_llm_bench(
    *,
    tokens: int = 48,
    blas_threads: int = 1,
    rounds: int = 3,
    secure_pairs: int = SECURE_PAIRS,
    secure_warmup: int = SECURE_WARMUP,
    concurrency: Sequence[int] = DEFAULT_LEVELS,
    only_concurrency: bool = False,
) -> LlmResult:
    """Every part of the suite, then the many users at once at each of ``concurrency``'s
    levels (:mod:`hecate_dev.bench.llm_concurrency`; ``only_concurrency``: that part alone,
    under ``"concurrency"``). A wrong text anywhere is listed in ``failed_checks``."""
    path = pull(MODEL, progress=lambda line: print(line, file=sys.stderr))
    prepare(path, float32=True)  # once, before six node processes would each build it
    if only_concurrency:
        users = run_concurrency(path, concurrency, tokens, rounds)
        only = {
            "concurrency": users,
            "failed_checks": users.failed_checks,
            "meta": {**_meta(tokens, blas_threads, rounds), "only_concurrency": True},
        }
        return msgspec.convert(only, LlmResult)
    expected = greedy_text(path, PROMPT, tokens)
    three = [("s0", 0, 10), ("s1", 10, 20), ("s2", 20, 30)]
    two_pipelines = [
        [("a0", 0, 10), ("a1", 10, 20), ("a2", 20, 30)],
        [("b0", 0, 10), ("b1", 10, 20), ("b2", 20, 30)],
    ]

    def swarm_run(pipelines: list[list[tuple[str, int, int]]], **kwargs: Any) -> dict[str, Any]:
        return check_text(swarm(pipelines, tokens, **kwargs), expected)

    build = llama_cpp_build()
    reference = None if "skipped" in build else LlamaCpp(path)
    # The headline ratios, in interleaved rounds (single, llama.cpp, 3 stages, single,
    # ...): this machine's speed drifts by 10-20 % over minutes, and a ratio within one
    # round cancels most of it. The median round is reported, every round is listed.
    per_round: list[dict[str, Any]] = []
    for _ in range(rounds):
        rnd: dict[str, Any] = {"single": check_text(single(path, tokens), expected)}
        # The engine on the one thread a node's stage computes on, in a fresh process (so
        # that it starts with no spinning threads of the run before).
        rnd["single_1_thread"] = check_text(single_one_thread(tokens), expected)
        if reference is not None:
            _settle()
            run = reference.run(tokens)
            run["matches_numpy_text"] = run.pop("text") == expected  # the engine's text
            rnd["llama_cpp"] = run
        rnd["stages_3"] = swarm_run([three], blas_threads=blas_threads)
        per_round.append(rnd)
    del reference  # its threads and weights stay out of the remaining runs
    singles = [r["single"] for r in per_round]

    def ratios(over: str, under: str) -> list[float]:
        return [round(r[over]["tokens_per_s"] / r[under]["tokens_per_s"], 3) for r in per_round]

    stages_rounds = ratios("stages_3", "single")
    stages_one_thread_rounds = ratios("stages_3", "single_1_thread")
    # The locked-down bus against the open one: both swarms standing side by side, many
    # pairs (see the module).
    pairs = side_by_side(
        [three], tokens, pairs=secure_pairs, warmup=secure_warmup, blas_threads=blas_threads
    )
    for pair in pairs:
        for side in ("stages_3", "stages_3_secure"):
            check_text(pair[side], expected)
    result: dict[str, Any] = {
        "single": _median_run(singles),
        "stages_3": _median_run([r["stages_3"] for r in per_round]),
        "ratio_3_stages_rounds": stages_rounds,
        "ratio_3_stages_1_thread_rounds": stages_one_thread_rounds,
        **secure_figures(pairs, secure_warmup),
        "single_1_thread": _median_run([r["single_1_thread"] for r in per_round]),
        "stages_1": swarm_run([[("s0", 0, 30)]], blas_threads=blas_threads),
        "stages_2": swarm_run([[("s0", 0, 15), ("s1", 15, 30)]], blas_threads=blas_threads),
        "stages_3_hop": swarm_run([three], dispatch="hop", blas_threads=blas_threads),
        "stage_steps_1_thread": in_process("stage_steps(path, 1)", {}),
        "stage_steps_2_threads": in_process("stage_steps(path, 2)", {}),
    }
    gap_s = result["stages_3"]["gap_ms"] / 1000
    # Killed as the token arrives, the victim is idle (the next step reaches it a few ms
    # later: no-responders). Killed ~40 % into the next step, it is computing its share
    # (the first stage takes about a third of a step): the step is lost with it and
    # only telemetry's node-down tells the router.
    result["kill_between_steps"] = swarm_run(
        two_pipelines, kill_after=tokens // 3, blas_threads=blas_threads
    )
    result["kill_mid_step"] = swarm_run(
        two_pipelines,
        kill_after=tokens // 3,
        kill_delay_s=0.4 * gap_s,
        blas_threads=blas_threads,
    )
    result["llama_cpp"] = build
    if "skipped" not in build:
        result["llama_cpp"] = {**build, **_median_run([r["llama_cpp"] for r in per_round])}
        result["ratio_single_llama_cpp_rounds"] = ratios("single", "llama_cpp")
        result["ratio_single_llama_cpp"] = _median(result["ratio_single_llama_cpp_rounds"])
    result["ratio_3_stages"] = _median(stages_rounds)
    result["rounds"] = per_round
    result["failed_checks"] = failed_checks(result)
    result["meta"] = {**_meta(tokens, blas_threads, rounds), "text": expected}
    if concurrency:
        users = run_concurrency(path, concurrency, tokens, rounds)
        result["concurrency"] = users
        result["failed_checks"] += users.failed_checks
    measured = msgspec.convert(result, LlmResult)
    return msgspec.structs.replace(measured, secure_over_open_met=judge_secure(measured)[0])


def _meta(tokens: int, blas_threads: int, rounds: int) -> dict[str, Any]:
    return {
        "tokens": tokens,
        "node_blas_threads": blas_threads,
        "rounds": rounds,
        "prompt": PROMPT,
        "greedy": True,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
    }
