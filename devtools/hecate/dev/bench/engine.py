"""The engine beside the numpy model, on the same steps: ``python -m hecate.dev.bench.engine``.

Decode steps of the whole model (30 blocks and the head) at batch 1 and 16, each session
past its prompt, in interleaved rounds (numpy, then ONNX Runtime, round after round), so
that a slower minute of the machine costs both alike. Prints the median time per step,
tokens per second, and the ratio of the engine over numpy per round with its spread.

It checks what it times: each engine's tokens at batch 16 must be its tokens at batch 1
for the same prompt (batching changes no answer), and the engine's batch-1 text is
printed beside numpy's with the first step where they part, if they do.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
    times: dict[tuple[str, int], list[float]] = {(e, b): [] for e in engines for b in (1, batch)}
    answers: dict[str, tuple[list[int], list[list[int]]]] = {}
    for _ in range(rounds):
        for name, runner in engines.items():
            single, t1 = runner(prompts[:1], steps)
            several, tb = runner(many, steps)
            times[(name, 1)].append(t1)
            times[(name, batch)].append(tb)
            answers[name] = (single[0], several)
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
    np_one, ort_one = answers["numpy"][0], answers["onnx"][0]
    result["texts"] = {"numpy": tok.decode(np_one), "onnx": tok.decode(ort_one)}
    result["first_difference"] = _first_difference(np_one, ort_one)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    path = pull("smollm2-135m", progress=lambda _line: None)
    out = run(path, rounds=args.rounds, steps=args.steps, batch=args.batch, threads=args.threads)
    for key, value in out.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
