"""Mixtures of experts on the engine (``mixtral``, ``qwen3moe``): sessions batched in one
run that route their rows to different experts answer as each alone, and a model cut
into stages answers as one stage holding it whole (each stage holding the experts of
its own blocks). The files are the synthetic goldens' (test_synthetic_golden.py holds
them to llama.cpp's answers and routing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hecate.llm.onnx_stage import OnnxStage
from tests.shared.engine.test_synthetic_golden import golden, model_file

CASES = ("moe/mixtral", "moe/qwen3moe")
STEPS = 6


def prompts(vocab: int) -> list[list[int]]:
    """Four prompts of their own lengths and tokens: their rows pick different experts."""
    rng = np.random.default_rng(11)
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in (5, 17, 9, 30)]


def greedy(stages: list[OnnxStage], batch: list[list[int]], steps: int) -> list[list[int]]:
    """Each prompt's greedy tokens, the prompts run together through ``stages`` in turn."""
    slots = [[s.new_cache() for _ in batch] for s in stages]
    xs = [stages[0].embed(ids) for ids in batch]
    out: list[list[int]] = [[] for _ in batch]
    for _ in range(steps):
        for stage, held in zip(stages, slots, strict=True):
            xs = stage.forward_batch(xs, held)
        logits = stages[-1].logits_of(xs)
        for j, row in enumerate(logits):
            out[j].append(int(np.argmax(row)))
        xs = [stages[0].embed([t[-1]]) for t in out]
    for stage, held in zip(stages, slots, strict=True):
        for slot in held:
            stage.free(slot)
    return out


@pytest.mark.parametrize("case", CASES)
def test_sessions_that_pick_different_experts_answer_in_a_batch_as_alone(
    case: str, tmp_path: Path
) -> None:
    path = model_file(case, tmp_path)
    assert golden(case)["routing"]["distinct_sets"][0] > 1  # routing varies by row
    layers, vocab = golden(case)["shape"]["layers"], golden(case)["shape"]["vocab"]
    batch = prompts(vocab)
    together = greedy([OnnxStage(path, 0, layers, threads=1, slots=len(batch))], batch, STEPS)
    one = OnnxStage(path, 0, layers, threads=1, slots=1)
    for ids, tokens in zip(batch, together, strict=True):
        assert greedy([one], [ids], STEPS) == [tokens]


@pytest.mark.parametrize("case", CASES)
def test_a_model_of_experts_cut_in_stages_answers_as_whole(case: str, tmp_path: Path) -> None:
    path = model_file(case, tmp_path)
    layers, vocab = golden(case)["shape"]["layers"], golden(case)["shape"]["vocab"]
    batch = prompts(vocab)
    whole = greedy([OnnxStage(path, 0, layers, threads=1, slots=len(batch))], batch, STEPS)
    cut = [OnnxStage(path, a, a + 1, threads=1, slots=len(batch)) for a in range(layers)]
    assert greedy(cut, batch, STEPS) == whole
