"""Gemma 3 270M, the built-in ``gemma3-270m``, answered by the engine as llama.cpp answers
it (golden/make_gemma3_greedy_golden.py): a chat in Gemma's turns, and a text of 1,069
tokens, past the 512 positions its sliding layers attend to, fed in the chunks a node's
first stage runs a prompt in. Step-0 logits correlate at 0.998 or better and,
teacher-forced, the engine picks llama.cpp's token wherever llama.cpp was sure; the
model whole and cut in two stages at a sliding layer answer alike.

The file is the one ``hecate model pull gemma3-270m`` puts in the model cache (``make
models`` does before the tests); skipped, saying so, where it is not there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hecate.llm.chunks import PREFILL_CHUNK
from hecate.llm.onnx_stage import OnnxStage
from hecate.llm.store import MODELS, model_path, present
from tests.shared.engine.test_synthetic_golden import Feed, Logits, disagreements

MODEL = "gemma3-270m"
HERE = Path(__file__).resolve().parent / "golden"
GOLDEN: dict[str, Any] = json.loads((HERE / "gemma3-270m-llama-cpp.json").read_text())
LAYERS = 18
CUT = 7  # layer 6 slides, 5 and 11 attend to everything


@pytest.fixture(scope="module")
def gemma() -> Path:
    if not present(MODEL):
        pytest.skip(f"{MODEL} is not in the model cache (`hecate model pull {MODEL}`)")
    return model_path(MODEL)


def chunked(stages: list[OnnxStage]) -> Feed:
    """Feeds ids through ``stages`` in the chunks a first stage runs a prompt in."""
    slots = [s.new_cache() for s in stages]

    def feed(ids: list[int]) -> Logits:
        for a in range(0, len(ids), PREFILL_CHUNK):
            x = stages[0].embed(ids[a : a + PREFILL_CHUNK])
            for stage, slot in zip(stages, slots, strict=True):
                x = stage.forward_batch([x], [slot])[0]
        out: Logits = x[0]
        return out

    return feed


def test_the_reference_is_of_the_built_in_file() -> None:
    assert GOLDEN["sha256"] == MODELS[MODEL].sha256
    assert len(GOLDEN["cases"]["long"]["prompt"]) > 2 * 512  # the window is crossed


@pytest.mark.parametrize("case", sorted(GOLDEN["cases"]))
def test_the_engine_answers_gemma3_as_llama_cpp(gemma: Path, case: str) -> None:
    g = {**GOLDEN["cases"][case], "step0_logits": np.load(HERE / "gemma3-270m-llama-cpp.npz")[case]}
    whole = [OnnxStage(gemma, 0, LAYERS, threads=2, slots=1)]
    assert disagreements(chunked(whole), g) == []
    cut = [
        OnnxStage(gemma, 0, CUT, threads=2, slots=1),
        OnnxStage(gemma, CUT, LAYERS, threads=2, slots=1),
    ]
    assert disagreements(chunked(cut), g) == []
