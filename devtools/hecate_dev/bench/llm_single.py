"""The single-process runs of ``hecate bench llm``: the nodes' engine (ONNX Runtime on
the GGUF's own blocks) on the whole model in this process, one 10-block stage's decode
step, and llama.cpp on the same GGUF (see :mod:`hecate_dev.bench.llm`)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from hecate.llm.onnx_stage import OnnxStage
from hecate.llm.reference import whole_model
from hecate.llm.tokenizer import TextStream, eos_ids, load_tokenizer

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
LLAMA_CPP_THREADS = 2
LLAMA_CPP_EXTRA = "pip install './devtools[bench]'"


def _text(path: Path, tokens: list[int]) -> str:
    """The text of greedy ``tokens`` as the router streams it: each token's text as the
    last stage gives it (characters whole), up to the end-of-turn token."""
    text, ends = TextStream(load_tokenizer(path)), eos_ids(path)
    out = []
    for token in tokens:
        if token in ends:
            break
        out.append(text.push(token))
    return "".join(out)


def single(path: Path, tokens: int, threads: int | None = None) -> dict[str, Any]:
    """The whole model on the engine in this process, on ``threads`` threads (default
    every core, spinning between runs: its best case, as llama.cpp's)."""
    stage = whole_model(path, threads=threads, spin=True)
    ids = load_tokenizer(path).encode(PROMPT).ids
    cache = stage.new_cache()
    t0 = time.perf_counter()
    token = int(np.argmax(stage.logits_of(stage.forward_batch([stage.embed(ids)], [cache]))[0]))
    ttft = time.perf_counter() - t0
    generated = [token]
    for _ in range(tokens - 1):
        outs = stage.forward_batch([stage.embed([token])], [cache])
        token = int(np.argmax(stage.logits_of(outs)[0]))
        generated.append(token)
    total = time.perf_counter() - t0
    stage.free(cache)
    return {
        "ttft_ms": round(ttft * 1000, 1),
        "tokens_per_s": round((tokens - 1) / (total - ttft), 1),
        "text": _text(path, generated),
    }


def batched(path: Path, prompts: list[str], tokens: int) -> dict[str, Any]:
    """``prompts`` generated together in this process, greedy, up to ``tokens`` each: the
    whole model on the engine on every core (spinning between runs, its best case), one
    session per prompt, every prompt's prefill in one batch and then one batched decode
    step for every session still going (a session leaves at its end-of-turn token), as
    one node holding the whole model would batch them. Aggregate tokens/s: every token
    generated ÷ the time from the first prefill to the last step; TTFT: the batched
    prefill's first tokens; each text as :func:`_text` gives it."""
    from hecate.llm.gguf_model import model_config

    layers = model_config(path).layers
    stage = OnnxStage(path, 0, layers, slots=len(prompts), capacity=1024, spin=True)
    tok, ends = load_tokenizer(path), eos_ids(path)
    # Untimed: the prompts' prefill and one batched step, so that the timed run pays no
    # first run of a shape (the swarm's nodes are warmed up too).
    caches = [stage.new_cache() for _ in prompts]
    outs = stage.forward_batch([stage.embed(list(tok.encode(p).ids)) for p in prompts], caches)
    stage.forward_batch([stage.embed([int(np.argmax(r))]) for r in stage.logits_of(outs)], caches)
    for cache in caches:
        stage.free(cache)
    caches = [stage.new_cache() for _ in prompts]
    texts: list[list[str]] = [[] for _ in prompts]
    streams = [TextStream(tok) for _ in prompts]
    xs = [stage.embed(list(tok.encode(p).ids)) for p in prompts]
    live = list(range(len(prompts)))
    generated = 0
    t0 = time.perf_counter()
    ttft: float | None = None
    for _ in range(tokens):
        outs = stage.forward_batch([xs[i] for i in live], [caches[i] for i in live])
        logits = stage.logits_of(outs)
        ttft = time.perf_counter() - t0 if ttft is None else ttft
        going = []
        for row, i in enumerate(live):
            token = int(np.argmax(logits[row]))
            if token in ends:
                continue
            texts[i].append(streams[i].push(token))
            generated += 1
            xs[i] = stage.embed([token])
            going.append(i)
        live = going
        if not live:
            break
    total = time.perf_counter() - t0
    for cache in caches:
        stage.free(cache)
    return {
        "sessions": len(prompts),
        "tokens": generated,
        "ttft_ms": round((ttft or 0.0) * 1000, 1),
        "aggregate_tokens_per_s": round(generated / total, 2),
        "texts": ["".join(t) for t in texts],
    }


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

    def __init__(self, path: Path, threads: int = LLAMA_CPP_THREADS, context: int = 256) -> None:
        llama = importlib.import_module("llama_cpp")
        self.path = path
        # logits_all: llama-cpp-python keeps a step's logits (``scores``) only then; the
        # extra rows are the prompt's, computed once in the prefill.
        self.llm = llama.Llama(
            model_path=str(path),
            n_threads=threads,
            n_threads_batch=threads,
            n_ctx=context,
            logits_all=True,
            verbose=False,
        )

    def _step(self, ids: list[int]) -> int:
        self.llm.eval(ids)
        return int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))

    def greedy(self, ids: list[int], steps: int) -> tuple[list[int], float]:
        """The prompt ``ids``' greedy token and ``steps`` more, and the seconds per
        decode step (the prefill not counted)."""
        self.llm.reset()
        tokens = [self._step(ids)]
        t0 = time.perf_counter()
        for _ in range(steps):
            tokens.append(self._step(tokens[-1:]))
        return tokens, (time.perf_counter() - t0) / steps

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


def stage_steps(
    path: Path, threads: int, steps: int = 40, pause_s: float = 0.025
) -> dict[str, float]:
    """One 10-block stage's decode step (median ms) on the engine as a node runs it
    (``threads`` threads that do not spin between runs), back to back and after a pause
    as long as the other stages' share of a token: what a pipeline stage sees."""
    stage = OnnxStage(path, 10, 20, threads=threads, slots=1, spin=False)
    cache = stage.new_cache()
    rng = np.random.default_rng(0)
    stage.forward_batch([rng.standard_normal((5, 576), dtype=np.float32)], [cache])
    out: dict[str, float] = {}
    for label, pause in (("busy_ms", 0.0), ("after_pause_ms", pause_s)):
        times = []
        for _ in range(steps):
            x = rng.standard_normal((1, 576), dtype=np.float32)
            t = time.perf_counter()
            stage.forward_batch([x], [cache])
            times.append(time.perf_counter() - t)
            if pause:
                time.sleep(pause)
        out[label] = round(float(np.median(times)) * 1000, 2)
    return out


def in_process(call: str, env: dict[str, str]) -> Any:
    """``call`` (an expression over this module and ``path``) in a fresh interpreter, so
    that BLAS starts with ``env``'s thread settings."""
    code = (
        "import json; from hecate_dev.bench.llm_single import *; from hecate.llm.store import "
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
    """The single-process engine on one thread, in a fresh process."""
    result: dict[str, Any] = in_process(f"single(path, {tokens}, threads=1)", {})
    return result
