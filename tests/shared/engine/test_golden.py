"""The numpy SmolLM2 against llama.cpp, an implementation that is not ours.

The golden files ``tests/shared/engine/golden/smollm2-135m-llama-cpp.{json,npz}`` were written by
``tests/shared/engine/golden/make_golden.py`` (run by hand: ``.venv/bin/pip install -e
'./devtools[bench]'`` then ``.venv/bin/python tests/shared/engine/golden/make_golden.py``) with
llama-cpp-python 0.3.36, built from PyPI's source by gcc 12 on an x86_64 AMD EPYC
(AVX2, FMA, OpenMP; the json has its system info), 2 threads, on the same GGUF (its
sha256 is in the json, checked here). For each of four short prompts (plain text,
a story, code, a chat turn) they hold llama.cpp's greedy token ids for 16 steps, the
margin of each choice (its top-1 minus top-2 logit) and its full step-0 logits
(float16). llama.cpp is not needed to run this.

llama.cpp multiplies with 8-bit-quantized activations, so where two tokens are nearly
tied its choice and ours may differ; comparing free-running generations would let one
flip change everything after it. So the check is teacher-forced: our model reads the
prompt and llama.cpp's tokens, and at every step where llama.cpp's margin exceeds
``MARGIN`` our argmax must be llama.cpp's token. The step-0 logits must correlate at
least ``MIN_CORRELATION``, and their difference, less its mean (adding a constant to
every logit changes no probability, and llama.cpp's are shifted by up to 0.35 on the
chat prompt), must have a root mean square of at most ``MAX_RMS``. Measured when the
file was written, per prompt: 3 of 64 steps chose differently, at margins 0.11, 0.27
and 0.35 (52 steps have a margin over 0.5); correlation 0.9989-0.9995; RMS difference
less its mean 0.12-0.16, against a logit standard deviation of 2.9-3.7.

The bounds are not too loose to catch a real defect: the last tests break the model
(two blocks swapped, RoPE left out, RoPE rotating halves instead of adjacent pairs)
and check that each of the three criteria fails on its own. Measured: correlation
0.59-0.96, RMS 0.84-3.1, and 2-10 clear disagreements in every prompt.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hecate.llm import llama
from hecate.llm.gguf_model import load_stage, model_config
from hecate.llm.llama import LlamaStage
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

GOLDEN = Path(__file__).parent / "golden"
MARGIN = 0.5  # llama.cpp's top-1 over top-2 logit, above which we must agree
MIN_CORRELATION = 0.998  # step-0 logits, the lowest over the prompts
MAX_RMS = 0.25  # step-0 logits' difference less its mean, the highest over the prompts


@dataclass(frozen=True)
class Agreement:
    """How our model compares with the golden run: the steps where we chose another
    token although llama.cpp's margin exceeded ``MARGIN`` (prompt, step, margin), every
    disagreement at all, the lowest step-0 correlation and the highest RMS difference
    (less its mean)."""

    clear_disagreements: list[tuple[int, int, float]]
    disagreements: int
    correlation: float
    rms: float


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((GOLDEN / "smollm2-135m-llama-cpp.json").read_text())
    with np.load(GOLDEN / "smollm2-135m-llama-cpp.npz") as npz:
        doc["step0_logits"] = npz["step0_logits"].astype(np.float32)
    return doc


@pytest.fixture(scope="module")
def gguf() -> Path:
    return pull("smollm2-135m", progress=lambda _line: None)


@pytest.fixture(scope="module")
def whole(gguf: Path) -> LlamaStage:
    return LlamaStage(load_stage(gguf, 0, 30))


def compare(stage: LlamaStage, golden: dict[str, Any]) -> Agreement:
    clear: list[tuple[int, int, float]] = []
    disagreements = 0
    correlations, rms = [], []
    for p, prompt in enumerate(golden["prompts"]):
        ids, tokens, margins = prompt["prompt_ids"], prompt["tokens"], prompt["margins"]
        # One prefill of the prompt and llama.cpp's tokens: row len(ids) - 1 + i is what
        # the model sees before choosing step i.
        hidden = stage.forward(stage.embed(ids + tokens[:-1]), stage.new_cache())
        for i, (token, margin) in enumerate(zip(tokens, margins, strict=True)):
            logits = stage.logits(hidden[: len(ids) + i])
            if i == 0:
                theirs = golden["step0_logits"][p]
                correlations.append(float(np.corrcoef(logits, theirs)[0, 1]))
                rms.append(float(np.std(logits - theirs)))
            if int(np.argmax(logits)) != token:
                disagreements += 1
                if margin > MARGIN:
                    clear.append((p, i, margin))
    return Agreement(clear, disagreements, min(correlations), max(rms))


def test_the_golden_file_is_of_this_gguf_and_tokenizer(golden: dict[str, Any], gguf: Path) -> None:
    assert golden["gguf_sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    tok = load_tokenizer(gguf)
    for prompt in golden["prompts"]:
        # llama.cpp's own tokenizer agrees with ours (the check below feeds ours to both).
        assert tok.encode(prompt["text"]).ids == prompt["prompt_ids"]
        assert prompt["llama_cpp_prompt_ids"] == prompt["prompt_ids"]
    assert len(golden["prompts"]) == golden["step0_logits"].shape[0]
    assert golden["step0_logits"].shape[1] == model_config(gguf).vocab


def test_our_model_chooses_llama_cpp_s_token_wherever_the_choice_is_clear(
    whole: LlamaStage, golden: dict[str, Any]
) -> None:
    found = compare(whole, golden)
    assert found.clear_disagreements == [], found
    assert found.correlation >= MIN_CORRELATION, found
    assert found.rms <= MAX_RMS, found
    # Most steps are clear: the margin bound is not what makes this pass.
    clear = sum(m > MARGIN for p in golden["prompts"] for m in p["margins"])
    assert clear >= 0.75 * sum(len(p["margins"]) for p in golden["prompts"])


def _fails_every_criterion(found: Agreement) -> None:
    assert len(found.clear_disagreements) >= 2, found
    assert found.correlation < MIN_CORRELATION, found
    assert found.rms > MAX_RMS, found


def test_the_comparison_fails_a_model_with_two_blocks_swapped(
    whole: LlamaStage, golden: dict[str, Any]
) -> None:
    blocks = list(whole.w.blocks)
    blocks[10], blocks[11] = blocks[11], blocks[10]
    _fails_every_criterion(compare(LlamaStage(replace(whole.w, blocks=blocks)), golden))


def test_the_comparison_fails_a_model_without_rope(
    whole: LlamaStage, golden: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llama, "rope", lambda x, _cos, _sin, _interleaved: x)
    _fails_every_criterion(compare(whole, golden))


def test_the_comparison_fails_rope_on_halves_instead_of_adjacent_pairs(
    whole: LlamaStage, golden: dict[str, Any]
) -> None:
    """The other RoPE layout (GPT-NeoX's, qwen2's): the mistake the GGUF's permuted Q/K
    invite on a llama."""
    config = replace(whole.config, rope_interleaved=False)
    _fails_every_criterion(compare(LlamaStage(replace(whole.w, config=config)), golden))
