"""SmolLM2-135M from its GGUF, in numpy: right text, and splitting by layers changes nothing.

The model is fetched once per machine into the cache (``hecate model pull``); later
runs find it there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hecate.llm.gguf_model import load_stage
from hecate.llm.llama import LlamaStage
from hecate.llm.store import model_path, present, pull
from hecate.llm.tokenizer import load_tokenizer

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def gguf() -> Path:
    return pull(NAME, progress=lambda _line: None)


@pytest.fixture(scope="module")
def whole(gguf: Path) -> LlamaStage:
    return LlamaStage(load_stage(gguf, 0, 30))


def greedy(
    stages: list[LlamaStage], ids: list[int], steps: int
) -> Iterator[tuple[int, np.ndarray]]:
    caches = [s.new_cache() for s in stages]

    def through(tokens: list[int]) -> np.ndarray:
        h = stages[0].embed(tokens)
        for stage, cache in zip(stages, caches, strict=True):
            h = stage.forward(h, cache)
        return stages[-1].logits(h)

    logits = through(ids)
    for _ in range(steps):
        token = int(np.argmax(logits))
        yield token, logits
        logits = through([token])


def test_pull_is_a_no_op_when_the_model_is_there(gguf: Path) -> None:
    lines: list[str] = []
    assert pull(NAME, progress=lines.append) == gguf == model_path(NAME)
    assert present(NAME)
    assert lines == [f"{NAME}: already in {gguf}"]


def test_the_tokenizer_round_trips_and_keeps_special_tokens_whole(gguf: Path) -> None:
    tok = load_tokenizer(gguf)
    for text in ["The capital of France is", "12345 apples", "  spaces\n\ttabs", "日本語 ✓"]:
        assert tok.decode(tok.encode(text).ids) == text
    assert tok.encode("The capital of France is").ids == [504, 3575, 282, 4649, 314]
    assert len(tok.encode("1234").ids) == 4  # digits one by one (smollm pre-tokenizer)
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.token_to_id("<|im_end|>") in ids


def test_greedy_the_capital_of_france_is_paris(gguf: Path, whole: LlamaStage) -> None:
    tok = load_tokenizer(gguf)
    ids = tok.encode("The capital of France is").ids
    tokens = [t for t, _ in greedy([whole], ids, 3)]
    assert tok.decode(tokens).startswith(" Paris")


def test_three_stages_give_bit_identical_logits(gguf: Path, whole: LlamaStage) -> None:
    stages = [LlamaStage(load_stage(gguf, a, b)) for a, b in ((0, 10), (10, 20), (20, 30))]
    assert stages[0].w.output_norm is None  # each stage loads only what it runs
    assert stages[1].w.embedding is None
    ids = load_tokenizer(gguf).encode("Gravity is").ids
    single = list(greedy([whole], ids, 6))
    split = list(greedy(stages, ids, 6))
    assert [t for t, _ in single] == [t for t, _ in split]
    for (_, a), (_, b) in zip(single, split, strict=True):
        assert np.array_equal(a, b)


def test_prefill_of_prompt_and_tokens_matches_incremental_decoding(
    gguf: Path, whole: LlamaStage
) -> None:
    """What a failover replay relies on: re-running prompt + k tokens at once rebuilds
    the same state as generating them one by one."""
    ids = load_tokenizer(gguf).encode("Once upon a time").ids
    steps = list(greedy([whole], ids, 5))
    generated = [t for t, _ in steps]
    cache = whole.new_cache()
    replayed = whole.logits(whole.forward(whole.embed(ids + generated[:-1]), cache))
    assert np.max(np.abs(replayed - steps[-1][1])) < 1e-3
