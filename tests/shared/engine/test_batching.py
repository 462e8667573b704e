"""SmolLM2 steps batched across sessions give the answers of one session alone (on the
nodes' engine), and prompts run in chunks the answer of one prefill (on the numpy
reference, where chunks and one prefill differ only in summation order).

A greedy token must not change, unless two tokens are all but tied. Where the alone
run's margin (top-1 minus top-2 logit) is that small, a flip is reported with its
margin, not hidden: the test then fails on any flip whose margin is above
``NEAR_TIE``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hecate.llm.executor import LlmExecutor
from hecate.llm.gguf_model import load_stage
from hecate.llm.llama import LlamaStage
from hecate.llm.reference import whole_model
from hecate.llm.sessions import Stage
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate.model.executor import ExecutorError, StepInput, StepOutput
from hecate_dev.bench.concurrency import PROMPTS  # the benchmark's: short, distinct, one per user

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

MODEL = "smollm2-135m"
RANGES = [(0, 10), (10, 20), (20, 30)]
TOKENS = 16
NEAR_TIE = 1e-3  # a batch and one session alone: bit-equal on the engine; a flip above is a bug


@pytest.fixture(scope="module")
def gguf() -> Path:
    return pull(MODEL, progress=lambda _line: None)


@pytest.fixture(scope="module")
def whole(gguf: Path) -> LlamaStage:
    return LlamaStage(load_stage(gguf, 0, 30))


@pytest.fixture(scope="module")
def engine(gguf: Path) -> Stage:
    return whole_model(gguf)  # the nodes' engine, the whole model in one piece


def alone(stage: Stage, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens of one session by itself, and the margin of each choice."""
    cache = stage.new_cache()
    x = stage.embed(ids)
    tokens, margins = [], []
    for _ in range(steps):
        logits = stage.logits_of(stage.forward_batch([x], [cache]))[0]
        top = np.sort(logits)[-2:]
        tokens.append(int(np.argmax(logits)))
        margins.append(float(top[1] - top[0]))
        x = stage.embed([tokens[-1]])
    stage.free(cache)
    return tokens, margins


def through(llm: LlmExecutor, reqs: list[StepInput]) -> list[StepOutput]:
    """One batch of steps through the three stages, as chained nodes would run them."""
    replies: list[StepOutput] = []
    for start, end in RANGES:
        staged = [
            StepInput(
                model_id=MODEL,
                layer_start=start,
                layer_end=end,
                session=r.session,
                position=r.position,
                tokens=r.tokens if start == 0 else None,
                prompt=r.prompt if start == 0 else "",
                activation=b"" if start == 0 else replies[i].activation,
                decode_tokens=TOKENS,
                step=r.step,
            )
            for i, r in enumerate(reqs)
        ]
        results = llm.execute(staged)
        assert not [r for r in results if isinstance(r, ExecutorError)]
        replies = [r for r in results if isinstance(r, StepOutput)]
    return replies


def test_sixteen_prompts_in_one_batch_answer_as_each_alone(gguf: Path, engine: Stage) -> None:
    tok = load_tokenizer(gguf)
    llm = LlmExecutor(path=gguf)
    llm.prepare(RANGES)
    ids = [tok.encode(p).ids for p in PROMPTS]
    reqs = [
        StepInput(
            model_id=MODEL,
            layer_start=0,
            layer_end=10,
            session=f"s{j}",
            prompt=p,
        )
        for j, p in enumerate(PROMPTS)
    ]
    generated: list[list[int]] = [[] for _ in PROMPTS]
    for step in range(TOKENS):
        replies = through(llm, reqs)
        for j, reply in enumerate(replies):
            assert reply.token is not None
            assert reply.positions == (len(ids[j]) if step == 0 else 1)
            generated[j].append(reply.token)
        reqs = [
            StepInput(
                model_id=MODEL,
                layer_start=0,
                layer_end=10,
                session=r.session,
                position=len(ids[j]) + step,
                tokens=[generated[j][-1]],
                step=step + 1,
            )
            for j, r in enumerate(reqs)
        ]
    flips = []
    for j, prompt in enumerate(PROMPTS):
        expected, margins = alone(engine, ids[j], TOKENS)
        if generated[j] != expected:
            at = next(
                k for k, (a, b) in enumerate(zip(generated[j], expected, strict=True)) if a != b
            )
            flips.append((prompt, at, margins[at]))
    assert not [f for f in flips if f[2] > NEAR_TIE], f"batched greedy differs: {flips}"
    assert not flips, f"near-ties flipped (prompt, step, margin alone): {flips}"


# In make test-heavy: test_long_prompts.py sends a 1,200-token prompt through stages in
# five chunks and checks the single-process text, end to end.
@pytest.mark.heavy
def test_a_thousand_token_prompt_in_chunks_gives_the_one_prefill_token(
    gguf: Path, whole: LlamaStage
) -> None:
    tok = load_tokenizer(gguf)
    text = " ".join(
        f"Note {i}: the river town keeps its ledgers in a stone house by the ferry."
        for i in range(50)
    )
    ids = tok.encode(text + " The ledgers are kept in").ids
    assert 950 <= len(ids) <= 1100
    once = whole.logits(whole.forward(whole.embed(ids), whole.new_cache()))
    llm = LlmExecutor(path=gguf, engine="numpy")
    llm.limit_payload(1024 * 1024)  # NATS' default: a 256-position chunk fits
    position, positions = 0, []
    while True:
        reply = through(
            llm,
            [
                StepInput(
                    model_id=MODEL,
                    layer_start=0,
                    layer_end=10,
                    session="long",
                    position=position,
                    tokens=ids[position:],
                )
            ],
        )[0]
        assert reply.positions is not None
        positions.append(reply.positions)
        position += reply.positions
        if position >= len(ids):
            break
    full, rest = divmod(len(ids), 256)
    assert positions == [256] * full + ([rest] if rest else [])
    assert reply.token == int(np.argmax(once))
    # The same next token, and the same logits but for summation order.
    cache = whole.new_cache()
    for i in range(0, len(ids), 256):
        hidden = whole.forward(whole.embed(ids[i : i + 256]), cache)
    assert np.max(np.abs(whole.logits(hidden) - once)) < 1e-3


def test_a_prompt_beyond_the_context_is_prompt_too_long(gguf: Path) -> None:
    llm = LlmExecutor(path=gguf)
    llm.prepare(RANGES[:1])
    with pytest.raises(ExecutorError) as refused:
        llm.step(
            StepInput(
                model_id=MODEL,
                layer_start=0,
                layer_end=10,
                session="huge",
                tokens=[504] * 8180,
                decode_tokens=16,
            )
        )
    assert refused.value.code == "prompt_too_long"
    assert "8,180 tokens" in refused.value.message
    assert "context of 8,192" in refused.value.message
    assert not llm._ranges[RANGES[0]].caches  # refused before any compute
