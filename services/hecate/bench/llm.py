"""``hecate bench llm``: SmolLM2-135M generation, in one process and across the swarm.

One run measures, greedy, the same prompt and token count:

* ``single``: the numpy model in this process (no bus), BLAS threads as configured;
* ``single_1_thread``: the same with BLAS pinned to one thread, as every node runs;
* ``stages_1`` / ``stages_2`` / ``stages_3``: one router and 1-3 node processes
  (``--executor smollm2``) on an embedded nats-server, the plan written to KV directly;
* ``kill_stall_ms``: with two 3-stage pipelines, the middle node of the serving one is
  SIGKILLed after ``kill_after`` tokens; the longest gap between two streamed tokens
  (detection + replay of the prompt and the tokens so far);
* ``llama_cpp``: the same GGUF under llama-cpp-python, only if it is installed.

Time to first token (TTFT) includes the prompt's prefill; tokens/s counts the tokens
after the first.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import nats
import numpy as np

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer
from hecate.cli.up import hecate_command
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.llm.gguf_model import load_stage
from hecate.llm.llama import LlamaStage
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest, StreamToken

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"


def single(path: Path, tokens: int) -> dict[str, float]:
    stage = LlamaStage(load_stage(path, 0, 30))
    ids = load_tokenizer(path).encode(PROMPT).ids
    cache = stage.new_cache()
    t0 = time.perf_counter()
    hidden = stage.forward(stage.embed(ids), cache)
    token = int(np.argmax(stage.logits(hidden)))
    ttft = time.perf_counter() - t0
    for _ in range(tokens - 1):
        hidden = stage.forward(stage.embed([token]), cache)
        token = int(np.argmax(stage.logits(hidden)))
    total = time.perf_counter() - t0
    return {
        "ttft_ms": round(ttft * 1000, 1),
        "tokens_per_s": round((tokens - 1) / (total - ttft), 1),
    }


def _plan(pipelines: list[list[tuple[str, int, int]]]) -> SwarmPlan:
    nodes = sorted({n for p in pipelines for n, _, _ in p})
    return SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id=MODEL, layers=30, replicas=len(pipelines)),),
        nodes=tuple(NodeProfile(node_id=n, capacity_layers=30) for n in nodes),
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
) -> tuple[float, float, list[float]]:
    nc = await nats.connect(url)
    inbox = nc.new_inbox()
    stamps: list[float] = []

    async def got(msg: Any) -> None:
        stamps.append(time.perf_counter())
        if on_token is not None:
            on_token(msgspec.json.decode(msg.data, type=StreamToken))

    sub = await nc.subscribe(inbox, cb=got)
    body = InferRequest(prompt=PROMPT, max_tokens=tokens, stream_to=inbox)
    t0 = time.perf_counter()
    msg = await nc.request(subjects.infer(MODEL), msgspec.json.encode(body), timeout=120)
    await sub.unsubscribe()
    await nc.close()
    reply = msgspec.json.decode(msg.data, type=InferReply)
    if not reply.ok or not stamps:
        raise RuntimeError(f"generation failed: {reply.error}")
    return t0, stamps[0], stamps


async def _ready(url: str) -> None:
    for _ in range(600):
        try:
            await _generate(url, 1)
            return
        except Exception:
            await asyncio.sleep(0.2)
    raise RuntimeError("the swarm never served the model")


def swarm(
    pipelines: list[list[tuple[str, int, int]]], tokens: int, kill_after: int | None = None
) -> dict[str, float]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", HECATE_LOG_LEVEL="WARNING")
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    quiet = subprocess.DEVNULL
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:

            async def write_plan() -> None:
                nc = await nats.connect(server.url)
                kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
                await kv.put(subjects.PLAN_KEY, msgspec.json.encode(_plan(pipelines)))
                await nc.close()

            asyncio.run(write_plan())
            procs["telemetry"] = subprocess.Popen(
                [*hecate_command(), "telemetry", "--nats", server.url, "--id", "telemetry"],
                env=env,
                stdout=quiet,
                stderr=quiet,
            )
            procs["router"] = subprocess.Popen(
                [
                    *hecate_command(),
                    "router",
                    "--nats",
                    server.url,
                    "--id",
                    "bench",
                    "--stage-timeout-ms",
                    "5000",
                ],
                env=env,
                stdout=quiet,
                stderr=quiet,
            )
            for node in sorted({n for p in pipelines for n, _, _ in p}):
                procs[node] = subprocess.Popen(
                    [
                        *hecate_command(),
                        "node",
                        "--nats",
                        server.url,
                        "--id",
                        node,
                        "--capacity-layers",
                        "30",
                        "--executor",
                        "smollm2",
                    ],
                    env=env,
                    stdout=quiet,
                    stderr=quiet,
                )
            asyncio.run(_ready(server.url))
            victim = pipelines[0][len(pipelines[0]) // 2][0]

            def maybe_kill(token: StreamToken) -> None:
                if kill_after is not None and token.index == kill_after - 1:
                    procs[victim].send_signal(signal.SIGKILL)

            t0, first, stamps = asyncio.run(_generate(server.url, tokens, maybe_kill))
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.terminate()
            for p in procs.values():
                p.wait(15)
            server.stop()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    out = {
        "ttft_ms": round((first - t0) * 1000, 1),
        "tokens_per_s": round((len(stamps) - 1) / (stamps[-1] - first), 1),
    }
    if kill_after is not None:
        out["kill_stall_ms"] = round(max(gaps) * 1000, 1)
        out["typical_gap_ms"] = round(float(np.median(gaps)) * 1000, 1)
    return out


def llama_cpp(path: Path, tokens: int) -> dict[str, float] | None:
    try:
        from llama_cpp import Llama  # type: ignore[import-not-found]
    except ImportError:
        return None
    llm = Llama(model_path=str(path), n_threads=2, verbose=False)
    t0 = time.perf_counter()
    llm(PROMPT, max_tokens=tokens, temperature=0.0)
    return {"tokens_per_s": round(tokens / (time.perf_counter() - t0), 1)}


def single_one_thread(tokens: int) -> dict[str, float]:
    """The single-process model with BLAS pinned to one thread, as each node runs."""
    code = (
        "import json; from hecate.bench.llm import single; from hecate.llm.store import "
        f"model_path; print(json.dumps(single(model_path('{MODEL}'), {tokens})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
        check=True,
    )
    result: dict[str, float] = msgspec.json.decode(out.stdout.strip().splitlines()[-1])
    return result


def run_llm_bench(*, tokens: int = 32) -> dict[str, Any]:
    path = pull(MODEL, progress=lambda line: print(line, file=sys.stderr))
    one = single(path, tokens)
    result: dict[str, Any] = {
        "single": one,
        "single_1_thread": single_one_thread(tokens),
        "stages_1": swarm([[("s0", 0, 30)]], tokens),
        "stages_2": swarm([[("s0", 0, 15), ("s1", 15, 30)]], tokens),
        "stages_3": swarm([[("s0", 0, 10), ("s1", 10, 20), ("s2", 20, 30)]], tokens),
        "kill": swarm(
            [
                [("a0", 0, 10), ("a1", 10, 20), ("a2", 20, 30)],
                [("b0", 0, 10), ("b1", 10, 20), ("b2", 20, 30)],
            ],
            tokens,
            kill_after=tokens // 3,
        ),
        "llama_cpp": llama_cpp(path, tokens),
    }
    three = result["stages_3"]["tokens_per_s"]
    result["ratio_3_stages"] = round(three / one["tokens_per_s"], 3)
    result["ratio_3_stages_same_blas"] = round(three / result["single_1_thread"]["tokens_per_s"], 3)
    result["meta"] = {
        "tokens": tokens,
        "prompt": PROMPT,
        "greedy": True,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
    }
    return result
