"""Answers held to a shape, and log-probabilities, on the stage that samples
(hecate.llm.constrain): with SmolLM2's own tokens, whatever the logits, an answer that
ends is valid JSON of its schema; a constraint rebuilt from the tokens sampled so far
(a rescue route's last stage) allows what the kept one allows; and the engine's greedy
answers under a schema validate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.llm.constrain import ConstraintError, Constraints, logprob_of
from hecate.llm.executor import LlmExecutor
from hecate.llm.sessions import sample
from hecate.llm.store import pull
from hecate.llm.tokenizer import eos_ids, load_tokenizer
from hecate.model.executor import ExecutorError, StepInput
from hecate.wire.common import OutputFormat

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

MODEL = "smollm2-135m"
VOCAB = 49152
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
SHAPE = OutputFormat(type="json_schema", schema=json.dumps(PERSON))


@pytest.fixture(scope="module")
def gguf() -> Path:
    return pull(MODEL, progress=lambda _line: None)


@pytest.fixture(scope="module")
def constraints(gguf: Path) -> Constraints:
    return Constraints(load_tokenizer(gguf), sorted(eos_ids(gguf)), VOCAB)


def test_a_valid_answer_passes_token_by_token_and_then_only_the_end_may_come(
    gguf: Path, constraints: Constraints
) -> None:
    ids = load_tokenizer(gguf).encode('{"name":"Ada","age":36,"pets":["cat"]}').ids
    for k in range(len(ids)):
        assert constraints.allowed("walk", SHAPE, ids[:k])[ids[k]]
    after = constraints.allowed("walk", SHAPE, ids)
    assert set(np.flatnonzero(after).tolist()) <= set(eos_ids(gguf))
    with pytest.raises(ConstraintError):
        constraints.allowed("broken", SHAPE, [*load_tokenizer(gguf).encode('{"nam').ids, 0])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), temperature=st.sampled_from([0.0, 0.7, 1.5]))
def test_whatever_the_logits_an_answer_that_ends_is_valid_json_of_its_schema(
    constraints: Constraints, gguf: Path, seed: int, temperature: float
) -> None:
    rng = np.random.default_rng(seed)
    ends = eos_ids(gguf)
    tokens: list[int] = []
    session = f"random-{seed}-{temperature}"
    for step in range(160):
        logits = rng.standard_normal(VOCAB).astype(np.float32) * 4
        allowed = constraints.allowed(session, SHAPE, tokens)
        token = sample(
            np.where(allowed, logits, np.float32(-np.inf)),
            temperature=temperature,
            seed=seed,
            step=step,
        )
        assert allowed[token]
        if token in ends:
            text = load_tokenizer(gguf).decode(tokens)
            jsonschema.validate(json.loads(text), PERSON)
            return
        tokens.append(token)
    # The schema bounds every part but the age's digits, each of which a comma may end.
    pytest.fail(f"no end within 160 tokens: {load_tokenizer(gguf).decode(tokens)!r}")


@settings(max_examples=15, deadline=None)
@given(cut=st.integers(0, 14))
def test_a_constraint_rebuilt_from_the_tokens_allows_what_the_kept_one_allows(
    gguf: Path, constraints: Constraints, cut: int
) -> None:
    """A node that never saw the session (a new session name here) builds its matcher
    from every token so far; one that kept it advances it by the new ones."""
    ids = load_tokenizer(gguf).encode('{"name":"Bo","age":7,"pets":["dog","cat"]}').ids
    constraints.allowed(f"kept-{cut}", SHAPE, ids[:cut])
    for k in range(cut + 1, min(cut + 4, len(ids))):
        kept = constraints.allowed(f"kept-{cut}", SHAPE, ids[:k])
        rebuilt = constraints.allowed(f"rescue-{cut}-{k}", SHAPE, ids[:k])
        assert np.array_equal(kept, rebuilt)


def test_a_logprob_is_the_models_own_distribution_and_the_top_come_most_likely_first(
    constraints: Constraints,
) -> None:
    logits = np.random.default_rng(3).standard_normal(VOCAB).astype(np.float32)
    best = int(np.argmax(logits))
    lp = logprob_of(logits, 17, 5, constraints.piece)
    every = [logprob_of(logits, t, 0, constraints.piece).logprob for t in (best, 17)]
    assert lp.token == 17
    assert lp.logprob == pytest.approx(every[1])
    assert lp.top[0].token == best
    assert lp.top[0].logprob == pytest.approx(every[0])
    assert [c.logprob for c in lp.top] == sorted((c.logprob for c in lp.top), reverse=True)
    # The probabilities the log-probabilities stand for add up to one.
    z = logits.astype(np.float64)
    lse = z[17] - lp.logprob
    assert float(np.exp(z - lse).sum()) == pytest.approx(1.0, abs=1e-9)


def test_the_engine_answers_under_a_schema_with_json_that_validates(gguf: Path) -> None:
    executor = LlmExecutor(MODEL, gguf)
    common: dict[str, Any] = {
        "model_id": MODEL,
        "layer_start": 0,
        "layer_end": 30,
        "decode_tokens": 64,
        "output_format": SHAPE,
        "logprobs": 2,
    }
    for i, prompt in enumerate(["Describe a pet owner as JSON.", "Who is Ada? Answer in JSON."]):
        session = f"json-{i}"
        out = executor.step(StepInput(session=session, messages=(("user", prompt),), **common))
        assert not isinstance(out, ExecutorError)
        got, position = [out.token], out.positions or 0
        while not out.eos and len(got) < 64:
            assert out.logprob is not None
            assert out.logprob.top[0].logprob >= out.logprob.logprob - 1e-9
            prev = got[-1]
            assert prev is not None
            out = executor.step(
                StepInput(
                    session=session,
                    position=position,
                    step=len(got),
                    tokens=[prev],
                    sampled=tuple(t for t in got if t is not None),
                    **common,
                )
            )
            position += 1
            got.append(out.token)
        assert out.eos, "a short schema's answer ends within 64 tokens"
        text = load_tokenizer(gguf).decode([t for t in got[:-1] if t is not None])
        jsonschema.validate(json.loads(text), PERSON)
        executor.release(session)
