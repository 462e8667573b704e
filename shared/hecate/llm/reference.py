"""Greedy generation in one process: the text the swarm must reproduce token for token
(each token's text as the last stage gives it, a character split over tokens given whole
by the token that ends it, and joined, as the router streams them; it stops at the
end-of-turn token). ``engine`` names what runs the model, as a node's executor does:
ONNX Runtime on the file's own blocks (the nodes' default), or the numpy model, whose
text is its own. The prompt runs in the chunks a node's first stage runs it in
(``chunk``), then a decode step a token: on the engine the numbers depend on how the
positions were grouped, so the reference groups them as the swarm does."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from hecate.llm.chunks import PREFILL_CHUNK
from hecate.llm.gguf_model import load_stage, model_config
from hecate.llm.llama import LlamaStage
from hecate.llm.sessions import Stage
from hecate.llm.tokenizer import TextStream, eos_ids, load_tokenizer


def whole_model(
    path: Path, engine: str = "onnx", *, threads: int | None = 1, spin: bool = False
) -> Stage:
    """The whole model in one stage; on the engine, on ``threads`` threads (None: every
    core), ``spin`` letting them spin between runs (see :class:`OnnxStage`)."""
    layers = model_config(path).layers
    if engine == "onnx":
        from hecate.llm.onnx_stage import OnnxStage

        return OnnxStage(path, 0, layers, threads=threads, slots=1, spin=spin)
    return LlamaStage(load_stage(path, 0, layers))


@functools.lru_cache(maxsize=2)
def _reference_model(path: Path, engine: str) -> Stage:
    """The whole model :func:`greedy_text` runs, built once per process (a graph of the
    whole model takes seconds to build; each text frees the cache it used)."""
    return whole_model(path, engine)


def greedy_text(
    path: Path,
    prompt: str,
    max_tokens: int,
    engine: str = "onnx",
    chunk: int = PREFILL_CHUNK,
) -> str:
    """Not for several threads at once: the texts share one model and its one slot."""
    stage = _reference_model(path, engine)
    tok = load_tokenizer(path)
    ends = eos_ids(path)
    text = TextStream(tok)
    ids = tok.encode(prompt).ids
    out: list[str] = []
    cache = stage.new_cache()
    try:
        for start in range(0, len(ids) - chunk, chunk):  # every chunk but the last
            stage.forward_batch([stage.embed(ids[start : start + chunk])], [cache])
        x = stage.embed(ids[(len(ids) - 1) // chunk * chunk :])
        for _ in range(max_tokens):
            token = int(np.argmax(stage.logits_of(stage.forward_batch([x], [cache]))[0]))
            if token in ends:
                break
            out.append(text.push(token))
            x = stage.embed([token])
    finally:
        stage.free(cache)
    return "".join(out)
