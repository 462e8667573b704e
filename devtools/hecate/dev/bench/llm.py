"""``hecate bench llm``: SmolLM2-135M generation, in one process and across the swarm.

One run measures, greedy, the same prompt and token count:

* ``single``: the numpy model in this process (no bus), BLAS threads as configured
  (by default every core, threads spinning between calls: its best case);
* ``single_1_thread``: the same in a process with BLAS pinned to one thread;
* ``stages_1`` / ``stages_2`` / ``stages_3``: one router (``--dispatch chain``) and 1-3
  node processes (``--executor smollm2``) on an embedded nats-server, the plan written
  to KV directly. Nodes run ``blas_threads`` BLAS threads with the short spin
  ``hecate up`` gives them (``OPENBLAS_THREAD_TIMEOUT=20``): threads that spin long
  after a call starve the other stage processes sharing the cores. ``stages_3_hop``:
  the router calls each stage; ``stages_3_1_thread``: one BLAS thread per node, to
  compare with ``single_1_thread``. ``stage_steps_*``: one 10-block stage's step back
  to back and after a 25 ms pause (the other stages' share of a token), per BLAS
  setting: the wake-up each stage pays per token;
* ``kill_between_steps`` / ``kill_mid_step``: two 3-stage pipelines; the middle node of
  the serving one is SIGKILLed after ``kill_after`` tokens, either as that token
  arrives (the victim is idle: the next step gets no-responders) or ~40 % into the next
  step (the victim is computing: the step dies with it, telemetry's node-down tells the
  router). ``kill_stall_ms`` is the longest gap between two streamed tokens (detection
  and the replay of the prompt and the tokens so far); ``failover_reason`` says which
  of the two it was;
* ``concurrency``: many users at once on the swarm ``make run`` starts (two 3-stage
  pipelines), at each level of ``--concurrency`` (default 1,2,4,8,16), in the same
  number of rounds, each user with its own prompt: answered, errors, lost, aggregate
  and per-user tokens/s, TTFT p50/p99, the text check and the verdicts
  (:mod:`hecate.dev.bench.llm_concurrency`, :mod:`hecate.dev.bench.concurrency`);
* ``llama_cpp``: the same GGUF under llama.cpp (llama-cpp-python, 2 threads, the
  dev tools' ``bench`` extra: ``pip install './devtools[bench]'``), fed the same prompt
  token ids and decoded greedy for the same number of tokens, timed in the same rounds as
  ``single`` (``ratio_single_llama_cpp_rounds``); its version and build flags are
  recorded beside it. Without the extra it says it was skipped and why.

Every timed generation is checked against the single-process greedy text
(:func:`hecate.llm.reference.greedy_text`): a run whose text differs carries
``text_ok: false`` and is listed in ``failed_checks``, which fails the command after the
result is saved: a fast wrong answer is not a figure. llama.cpp's text is only compared
(``matches_numpy_text``): it multiplies with 8-bit activations, so near-ties may flip.

Time to first token (TTFT) includes the prompt's prefill; tokens/s counts the tokens
after the first; ``gap_ms`` is the median time between two tokens.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import itertools
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import nats
import numpy as np

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.dev.bench.concurrency import DEFAULT_LEVELS
from hecate.dev.bench.llm_concurrency import run_concurrency
from hecate.launch import BLAS_THREAD_TIMEOUT, Supervisor, node_env
from hecate.llm.gguf_model import load_stage, prepare
from hecate.llm.llama import LlamaStage
from hecate.llm.reference import EOS, greedy_text
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent, InferReply, InferRequest, StreamToken

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
LLAMA_CPP_THREADS = 2
LLAMA_CPP_EXTRA = "pip install './devtools[bench]'"


def _text(path: Path, tokens: list[int]) -> str:
    """The text of greedy ``tokens`` as the router streams it: each token decoded on its
    own, up to the end-of-turn token."""
    tok = load_tokenizer(path)
    out = []
    for token in tokens:
        if token == EOS:
            break
        out.append(tok.decode([token]))
    return "".join(out)


def single(path: Path, tokens: int) -> dict[str, Any]:
    stage = LlamaStage(load_stage(path, 0, 30))
    ids = load_tokenizer(path).encode(PROMPT).ids
    cache = stage.new_cache()
    t0 = time.perf_counter()
    hidden = stage.forward(stage.embed(ids), cache)
    token = int(np.argmax(stage.logits(hidden)))
    ttft = time.perf_counter() - t0
    generated = [token]
    for _ in range(tokens - 1):
        hidden = stage.forward(stage.embed([token]), cache)
        token = int(np.argmax(stage.logits(hidden)))
        generated.append(token)
    total = time.perf_counter() - t0
    return {
        "ttft_ms": round(ttft * 1000, 1),
        "tokens_per_s": round((tokens - 1) / (total - ttft), 1),
        "text": _text(path, generated),
    }


def _plan(pipelines: list[list[tuple[str, int, int]]]) -> SwarmPlan:
    nodes = sorted({n for p in pipelines for n, _, _ in p})
    return SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id=MODEL, layers=30, replicas=len(pipelines), executor="smollm2"),),
        nodes=tuple(NodeProfile(node_id=n, capacity_layers=30, executor="smollm2") for n in nodes),
        pipelines=tuple(
            Pipeline(
                pipeline_id=f"{MODEL}-r{i}",
                model_id=MODEL,
                stages=tuple(Stage(node_id=n, layer_start=a, layer_end=b) for n, a, b in p),
            )
            for i, p in enumerate(pipelines)
        ),
    )


async def _generate(
    url: str, tokens: int, on_token: Any = None
) -> tuple[float, float, list[float], list[str], InferReply, str]:
    """One streamed generation: its start, token arrival times, failover reasons, reply
    and the text as streamed."""
    nc = await nats.connect(url)
    inbox = nc.new_inbox()
    stamps: list[float] = []
    reasons: list[str] = []
    streamed: list[StreamToken] = []

    async def failover(msg: Any) -> None:
        reasons.append(msgspec.json.decode(msg.data, type=FailoverEvent).reason)

    await nc.subscribe(subjects.EVENT_FAILOVER, cb=failover)

    async def got(msg: Any) -> None:
        stamps.append(time.perf_counter())
        token = msgspec.json.decode(msg.data, type=StreamToken)
        streamed.append(token)
        if on_token is not None:
            on_token(token)

    sub = await nc.subscribe(inbox, cb=got)
    body = InferRequest(prompt=PROMPT, max_tokens=tokens, stream_to=inbox)
    t0 = time.perf_counter()
    msg = await nc.request(subjects.infer(MODEL), msgspec.json.encode(body), timeout=120)
    await sub.unsubscribe()
    await nc.close()
    reply = msgspec.json.decode(msg.data, type=InferReply)
    if not reply.ok or not stamps:
        raise RuntimeError(f"generation failed: {reply.error}")
    text = "".join(t.text for t in sorted(streamed, key=lambda t: t.index))
    return t0, stamps[0], stamps, reasons, reply, text


async def _ready(url: str) -> None:
    for _ in range(600):
        try:
            await _generate(url, 1)
            return
        except Exception:
            await asyncio.sleep(0.2)
    raise RuntimeError("the swarm never served the model")


def swarm(
    pipelines: list[list[tuple[str, int, int]]],
    tokens: int,
    kill_after: int | None = None,
    *,
    kill_delay_s: float = 0.0,
    dispatch: str = "chain",
    blas_threads: int = 1,
) -> dict[str, Any]:
    env = node_env(dict(os.environ, HECATE_LOG_LEVEL="WARNING"), threads=blas_threads)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        swarm = Supervisor(env=env)
        try:

            async def write_plan() -> None:
                nc = await nats.connect(server.url)
                kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
                await kv.put(subjects.PLAN_KEY, msgspec.json.encode(_plan(pipelines)))
                await nc.close()

            asyncio.run(write_plan())
            nats_url = ("--nats", server.url)
            swarm.run("telemetry", "telemetry", *nats_url, "--id", "telemetry")
            swarm.run(
                "router",
                "router",
                *nats_url,
                "--id",
                "bench",
                "--stage-timeout-ms",
                "5000",
                "--dispatch",
                dispatch,
            )
            for node in sorted({n for p in pipelines for n, _, _ in p}):
                swarm.run(
                    node,
                    "node",
                    *nats_url,
                    "--id",
                    node,
                    "--capacity-layers",
                    "30",
                    "--executor",
                    "smollm2",
                )
            asyncio.run(_ready(server.url))
            # On an idle swarm the next generation takes the route this probe took.
            probe = asyncio.run(_generate(server.url, 1))[4].route
            assert probe is not None
            victim = probe.stages[len(probe.stages) // 2].node_id

            def maybe_kill(token: StreamToken) -> None:
                if kill_after is not None and token.index == kill_after - 1:
                    if kill_delay_s:  # aim at the victim's share of the next step
                        threading.Timer(kill_delay_s, swarm.kill, (victim,)).start()
                    else:
                        swarm.kill(victim, wait=False)

            t0, first, stamps, reasons, reply, streamed = asyncio.run(
                _generate(server.url, tokens, maybe_kill)
            )
        finally:
            swarm.stop(grace_s=15)
            server.stop()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    out: dict[str, Any] = {
        "ttft_ms": round((first - t0) * 1000, 1),
        "tokens_per_s": round((len(stamps) - 1) / (stamps[-1] - first), 1),
    }
    out["gap_ms"] = round(float(np.median(gaps)) * 1000, 1)
    if kill_after is not None:
        out["kill_stall_ms"] = round(max(gaps) * 1000, 1)
        out["failover_reason"] = reasons[0] if reasons else "none"
    out["text"] = reply.output or ""
    out["streamed_text"] = streamed
    return out


def llama_cpp_build() -> dict[str, Any]:
    """The installed llama-cpp-python: its version and the flags its llama.cpp was built
    with (the extra builds it from source with this machine's compiler, so they vary),
    or why it is not there."""
    try:
        llama = importlib.import_module("llama_cpp")
    except ImportError as exc:
        return {"skipped": f"llama-cpp-python not installed ({LLAMA_CPP_EXTRA}): {exc}"}
    info = llama.llama_print_system_info()
    return {
        "version": str(llama.__version__),
        "system_info": (info.decode() if isinstance(info, bytes) else str(info)).strip(),
        "threads": LLAMA_CPP_THREADS,
    }


class LlamaCpp:
    """llama.cpp on the same GGUF, loaded once, decoded greedy like :func:`single`: the
    same prompt token ids, an argmax over the last position's logits per step, and no
    stop at the end-of-turn token (the same number of steps)."""

    def __init__(self, path: Path) -> None:
        llama = importlib.import_module("llama_cpp")
        self.path = path
        # logits_all: llama-cpp-python keeps a step's logits (``scores``) only then; the
        # extra rows are the prompt's, computed once in the prefill.
        self.llm = llama.Llama(
            model_path=str(path),
            n_threads=LLAMA_CPP_THREADS,
            n_threads_batch=LLAMA_CPP_THREADS,
            n_ctx=256,
            logits_all=True,
            verbose=False,
        )

    def _step(self, ids: list[int]) -> int:
        self.llm.eval(ids)
        return int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))

    def run(self, tokens: int) -> dict[str, Any]:
        ids = load_tokenizer(self.path).encode(PROMPT).ids
        self.llm.reset()
        t0 = time.perf_counter()
        token = self._step(ids)
        ttft = time.perf_counter() - t0
        generated = [token]
        for _ in range(tokens - 1):
            token = self._step([token])
            generated.append(token)
        total = time.perf_counter() - t0
        return {
            "ttft_ms": round(ttft * 1000, 1),
            "tokens_per_s": round((tokens - 1) / (total - ttft), 1),
            "text": _text(self.path, generated),
        }


def stage_steps(path: Path, steps: int = 40, pause_s: float = 0.025) -> dict[str, float]:
    """One 10-block stage's decode step (median ms), back to back and after a pause as
    long as the other stages' share of a token: what a pipeline stage actually sees."""
    stage = LlamaStage(load_stage(path, 10, 20))
    cache = stage.new_cache()
    rng = np.random.default_rng(0)
    stage.forward(rng.standard_normal((5, 576), dtype=np.float32), cache)
    out: dict[str, float] = {}
    for label, pause in (("busy_ms", 0.0), ("after_pause_ms", pause_s)):
        times = []
        for _ in range(steps):
            x = rng.standard_normal((1, 576), dtype=np.float32)
            t = time.perf_counter()
            stage.forward(x, cache)
            times.append(time.perf_counter() - t)
            if pause:
                time.sleep(pause)
        out[label] = round(float(np.median(times)) * 1000, 2)
    return out


def _in_process(call: str, env: dict[str, str]) -> Any:
    """``call`` (an expression over this module and ``path``) in a fresh interpreter, so
    that BLAS starts with ``env``'s thread settings."""
    code = (
        "import json; from hecate.dev.bench.llm import *; from hecate.llm.store import "
        f"model_path; path = model_path('{MODEL}'); print(json.dumps({call}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        check=True,
    )
    return msgspec.json.decode(out.stdout.strip().splitlines()[-1])


def single_one_thread(tokens: int) -> dict[str, Any]:
    """The single-process model with BLAS pinned to one thread."""
    result: dict[str, Any] = _in_process(f"single(path, {tokens})", {"OPENBLAS_NUM_THREADS": "1"})
    return result


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
    # The median round's runs are listed at the top as well: named once, by round.
    first = rounds[0] if rounds else {}
    runs = [(k, v) for k, v in result.items() if isinstance(v, dict) and k not in first]
    for i, rnd in enumerate(rounds):
        runs += [(f"{k} (round {i + 1})", v) for k, v in rnd.items()]
    return sorted({f"{k}: wrong text" for k, v in runs if v.get("text_ok") is False})


def run_llm_bench(
    *,
    tokens: int = 48,
    blas_threads: int = 2,
    rounds: int = 3,
    concurrency: Sequence[int] = DEFAULT_LEVELS,
    only_concurrency: bool = False,
) -> dict[str, Any]:
    """Every part of the suite, then the many users at once at each of ``concurrency``'s
    levels (:mod:`hecate.dev.bench.llm_concurrency`; ``only_concurrency``: that part alone,
    under ``"concurrency"``). A wrong text anywhere is listed in ``failed_checks``."""
    path = pull(MODEL, progress=lambda line: print(line, file=sys.stderr))
    prepare(path)  # once, before six node processes would each build it
    if only_concurrency:
        users = run_concurrency(path, concurrency, tokens, rounds)
        return {
            "concurrency": users,
            "failed_checks": users["failed_checks"],
            "meta": {**_meta(tokens, blas_threads, rounds), "only_concurrency": True},
        }
    expected = greedy_text(path, PROMPT, tokens)
    three = [("s0", 0, 10), ("s1", 10, 20), ("s2", 20, 30)]
    two_pipelines = [
        [("a0", 0, 10), ("a1", 10, 20), ("a2", 20, 30)],
        [("b0", 0, 10), ("b1", 10, 20), ("b2", 20, 30)],
    ]
    build = llama_cpp_build()
    reference = None if "skipped" in build else LlamaCpp(path)
    # The headline ratios, in interleaved rounds (single, llama.cpp, 3 stages, single,
    # ...): this machine's speed drifts by 10-20 % over minutes, and a ratio within one
    # round cancels most of it. The median round is reported, every round is listed.
    per_round: list[dict[str, dict[str, Any]]] = []
    for _ in range(rounds):
        rnd = {"single": check_text(single(path, tokens), expected)}
        if reference is not None:
            _settle()
            run = reference.run(tokens)
            run["matches_numpy_text"] = run.pop("text") == expected
            rnd["llama_cpp"] = run
        rnd["stages_3"] = check_text(swarm([three], tokens, blas_threads=blas_threads), expected)
        per_round.append(rnd)
    del reference  # its threads and weights stay out of the remaining runs
    singles = [r["single"] for r in per_round]

    def ratios(over: str, under: str) -> list[float]:
        return [round(r[over]["tokens_per_s"] / r[under]["tokens_per_s"], 3) for r in per_round]

    def swarm_run(pipelines: list[list[tuple[str, int, int]]], **kwargs: Any) -> dict[str, Any]:
        return check_text(swarm(pipelines, tokens, **kwargs), expected)

    stages_rounds = ratios("stages_3", "single")
    result: dict[str, Any] = {
        "single": _median_run(singles),
        "stages_3": _median_run([r["stages_3"] for r in per_round]),
        "ratio_3_stages_rounds": stages_rounds,
        "single_1_thread": check_text(single_one_thread(tokens), expected),
        "stages_1": swarm_run([[("s0", 0, 30)]], blas_threads=blas_threads),
        "stages_2": swarm_run([[("s0", 0, 15), ("s1", 15, 30)]], blas_threads=blas_threads),
        "stages_3_hop": swarm_run([three], dispatch="hop", blas_threads=blas_threads),
        "stages_3_1_thread": swarm_run([three], blas_threads=1),
        "stage_steps_1_thread": _in_process("stage_steps(path)", {"OPENBLAS_NUM_THREADS": "1"}),
        "stage_steps_2_threads_sleep_at_once": _in_process(
            "stage_steps(path)", {"OPENBLAS_NUM_THREADS": "2", "OPENBLAS_THREAD_TIMEOUT": "4"}
        ),
        "stage_steps_2_threads_short_spin": _in_process(
            "stage_steps(path)",
            {"OPENBLAS_NUM_THREADS": "2", "OPENBLAS_THREAD_TIMEOUT": BLAS_THREAD_TIMEOUT},
        ),
        "stage_steps_2_threads_default_spin": _in_process(
            "stage_steps(path)", {"OPENBLAS_NUM_THREADS": "2"}
        ),
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
    result["ratio_3_stages_1_thread"] = round(
        result["stages_3_1_thread"]["tokens_per_s"] / result["single_1_thread"]["tokens_per_s"], 3
    )
    result["rounds"] = per_round
    result["failed_checks"] = failed_checks(result)
    result["meta"] = {**_meta(tokens, blas_threads, rounds), "text": expected}
    if concurrency:
        result["concurrency"] = run_concurrency(path, concurrency, tokens, rounds)
        result["failed_checks"] += result["concurrency"]["failed_checks"]
    return result


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
