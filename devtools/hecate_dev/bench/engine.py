"""The engine beside the numpy model and llama.cpp, on the same steps:
``python -m hecate_dev.bench.engine``.

Decode steps of the whole model (30 blocks and the head) at batch 1 and 16, each session
past its prompt, in interleaved rounds (each round: numpy's and ONNX Runtime's batches,
numpy's single session, then the engine's single session and llama.cpp's on the same
GGUF and thread count when llama-cpp-python is installed, side by side and which goes
first alternating), so that a slower minute of the machine costs all alike. Prints the
median time per step, tokens per second, and the ratios of the engine over numpy and
over llama.cpp per round with their spread.

``--memory``: what a node holding a range takes, in a fresh process per range (the whole
model, and a third of it): resident memory above the process's own before the stage is
built, once built, and with 16 sessions of 30 positions each (``/proc/self/status``).

It checks what it times: each engine's tokens at batch 16 must be its tokens at batch 1
for the same prompt (batching changes no answer), and the engine's batch-1 text is
printed beside numpy's and llama.cpp's with the first step where they part, if they do
(each multiplies differently: numpy in float32, the others with 8-bit activations).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hecate.llm.gguf_model import load_stage, model_config
from hecate.llm.llama import LlamaStage
from hecate.llm.onnx_stage import OnnxStage
from hecate.llm.sessions import Stage
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate_dev.bench.llm_single import LlamaCpp

#: A pause before each timed run: the run before leaves its threads spinning (BLAS's,
#: ONNX Runtime's) for a while, and they would take the cores the next one is timed on.
SETTLE_S = 0.5

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
]


def _runner(stage: Stage) -> Callable[[list[list[int]], int], tuple[list[list[int]], float]]:
    """Greedy decoding of ``prompts`` together, as a node's executor runs them (the
    head's logits through ``logits_of``); returns the tokens and the time per step."""

    def run(prompts: list[list[int]], steps: int) -> tuple[list[list[int]], float]:
        caches = [stage.new_cache() for _ in prompts]
        try:
            outs = stage.forward_batch([stage.embed(p) for p in prompts], caches)
            tokens = [[int(np.argmax(row))] for row in stage.logits_of(outs)]
            t0 = time.perf_counter()
            for _ in range(steps):
                outs = stage.forward_batch([stage.embed(t[-1:]) for t in tokens], caches)
                for t, row in zip(tokens, stage.logits_of(outs), strict=True):
                    t.append(int(np.argmax(row)))
            return tokens, (time.perf_counter() - t0) / steps
        finally:
            for cache in caches:
                stage.free(cache)

    return run


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def run(path: Path, *, rounds: int, steps: int, batch: int, threads: int) -> dict[str, Any]:
    layers = model_config(path).layers
    tok = load_tokenizer(path)
    prompts = [list(tok.encode(p).ids) for p in PROMPTS]
    many = [prompts[i % len(prompts)] for i in range(batch)]
    engines = {
        "numpy": _runner(LlamaStage(load_stage(path, 0, layers))),
        "onnx": _runner(OnnxStage(path, 0, layers, threads=threads, slots=batch, capacity=1024)),
    }
    try:
        reference: LlamaCpp | None = LlamaCpp(path, threads, context=1024)
    except ImportError as exc:  # the dev tools' bench extra: pip install './devtools[bench]'
        reference, skipped = None, f"llama-cpp-python not installed: {exc}"
    times: dict[tuple[str, int], list[float]] = {(e, b): [] for e in engines for b in (1, batch)}
    singles: dict[str, list[int]] = {}
    batches: dict[str, list[list[int]]] = {}
    llama_times: list[float] = []
    llama_tokens: list[int] = []
    for i in range(rounds):
        # The batches first; then the engine's single session and llama.cpp's side by
        # side, which goes first alternating: the machine's speed drifts within seconds.
        for name, runner in engines.items():
            time.sleep(SETTLE_S)
            batches[name], tb = runner(many, steps)
            times[(name, batch)].append(tb)
        order = ["numpy", "onnx", "llama.cpp"] if i % 2 == 0 else ["numpy", "llama.cpp", "onnx"]
        for name in order:
            time.sleep(SETTLE_S)
            if name in engines:
                single, t1 = engines[name](prompts[:1], steps)
                times[(name, 1)].append(t1)
                singles[name] = single[0]
            elif reference is not None:
                llama_tokens, t = reference.greedy(prompts[0], steps)
                llama_times.append(t)
    answers = {name: (singles[name], batches[name]) for name in engines}
    result: dict[str, Any] = {"rounds": rounds, "steps": steps, "batch": batch, "threads": threads}
    for name, (one, several) in answers.items():
        for prompt, got in zip(many, several, strict=True):
            if prompt == prompts[0] and got != one:
                raise AssertionError(f"{name}: batch {batch} changed a session's tokens")
    for (name, b), ts in times.items():
        median = statistics.median(ts)
        result[f"{name}_b{b}_ms"] = round(median * 1000, 2)
        result[f"{name}_b{b}_tokens_per_s"] = round(b / median, 1)
    for b in (1, batch):
        ratios = [n / o for n, o in zip(times[("numpy", b)], times[("onnx", b)], strict=True)]
        result[f"speedup_b{b}"] = round(statistics.median(ratios), 2)
        result[f"speedup_b{b}_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
    # Per round, for verdicts on their spread: the engine's tokens/s at each batch, and
    # the batch's tokens/s over the same round's single session.
    result["onnx_tokens_per_s_by_round"] = {
        str(b): [round(b / t, 1) for t in times[("onnx", b)]] for b in (1, batch)
    }
    result["onnx_batch_over_single_by_round"] = [
        round(batch * t1 / tb, 3)
        for t1, tb in zip(times[("onnx", 1)], times[("onnx", batch)], strict=True)
    ]
    np_one, ort_one = answers["numpy"][0], answers["onnx"][0]
    result["texts"] = {"numpy": tok.decode(np_one), "onnx": tok.decode(ort_one)}
    result["first_difference"] = _first_difference(np_one, ort_one)
    if reference is None:
        result["llama_cpp"] = skipped
        return result
    version = importlib.import_module("llama_cpp").__version__
    result["llama_cpp"] = f"llama-cpp-python {version}, {threads} threads"
    result["llama_cpp_b1_ms"] = round(statistics.median(llama_times) * 1000, 2)
    result["llama_cpp_b1_tokens_per_s"] = round(1 / statistics.median(llama_times), 1)
    over = [lt / o for lt, o in zip(llama_times, times[("onnx", 1)], strict=True)]
    result["engine_over_llama_cpp_b1"] = round(statistics.median(over), 2)
    result["engine_over_llama_cpp_b1_range"] = [round(min(over), 2), round(max(over), 2)]
    result["engine_over_llama_cpp_by_round"] = [round(x, 3) for x in over]
    result["texts"]["llama_cpp"] = tok.decode(llama_tokens)
    result["first_difference_llama_cpp"] = _first_difference(llama_tokens, ort_one)
    return result


def _resident_mib() -> float:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return sum(int(fields[k].split()[0]) for k in ("RssAnon", "RssFile")) / 1024


def held(path: Path, layer_start: int, layer_end: int, sessions: int = 16) -> dict[str, float]:
    """Resident MiB a stage of ``[layer_start, layer_end)`` adds to this process: built,
    then with ``sessions`` sessions of 30 positions (a prompt of 20, ten decode steps)."""
    before = _resident_mib()
    stage = OnnxStage(path, layer_start, layer_end, threads=2, slots=sessions, spin=False)
    built = _resident_mib()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, stage.config.hidden)).astype(np.float32)
    slots = [stage.new_cache() for _ in range(sessions)]
    for slot in slots:
        stage.forward_batch([x], [slot])
    for _ in range(10):
        stage.forward_batch([x[:1] for _ in slots], slots)
    return {"built_mib": round(built - before), "sessions_mib": round(_resident_mib() - before)}


def memory(path: Path) -> dict[str, Any]:
    """:func:`held` for the whole model and for its middle third, each in a fresh
    process (a range's memory, not what an earlier one left behind)."""
    layers = model_config(path).layers
    third = (layers // 3, 2 * layers // 3)
    out: dict[str, Any] = {}
    for label, (a, b) in {"whole": (0, layers), "third": third}.items():
        code = (
            "import json, sys; from pathlib import Path; from hecate_dev.bench.engine import "
            f"held; print(json.dumps(held(Path(sys.argv[1]), {a}, {b})))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
        )
        out[f"{label}_{a}_{b}"] = json.loads(done.stdout.strip().splitlines()[-1])
    whole, part = (v["sessions_mib"] for v in out.values())
    out["third_over_whole"] = round(part / whole, 2)
    return out


def run_suite(*, rounds: int, steps: int, batch: int = 16) -> dict[str, Any]:
    """``hecate bench engine``: :func:`run` on every core, then :func:`memory`."""
    path = pull("smollm2-135m", progress=lambda _line: None)
    out = run(path, rounds=rounds, steps=steps, batch=batch, threads=os.cpu_count() or 1)
    out["memory"] = memory(path)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--memory", action="store_true", help="what a range holds, instead")
    args = parser.parse_args(argv)
    path = pull("smollm2-135m", progress=lambda _line: None)
    if args.memory:
        out = memory(path)
    else:
        out = run(
            path, rounds=args.rounds, steps=args.steps, batch=args.batch, threads=args.threads
        )
    for key, value in out.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
