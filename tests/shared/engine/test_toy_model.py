"""The toy model: any split of the layers, in any process, gives the reference bytes."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hecate.model
from hecate.executors import EXECUTORS, get_executor
from hecate.model import MAX_LAYERS, MAX_TOKENS, Executor, ExecutorError
from hecate.model.toy import VOCABULARY, ToyModel, reference

MODEL = "toy-7b"
PROMPT = "the quick brown fox"

prompts = st.text(max_size=40)
model_ids = st.text(min_size=1, max_size=20)


@st.composite
def partitions(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    """A depth L and a split of [0, L) into contiguous, non-empty, ordered ranges."""
    layers = draw(st.integers(min_value=1, max_value=48))
    cuts = draw(st.sets(st.integers(min_value=1, max_value=layers - 1))) if layers > 1 else set()
    bounds = [0, *sorted(cuts), layers]
    return layers, list(itertools.pairwise(bounds))


def through(model: ToyModel, model_id: str, ranges: list[tuple[int, int]], x: bytes) -> bytes:
    """Run ``x`` through ``ranges`` in order, as a pipeline of nodes would."""
    for start, end in ranges:
        x = model.run(model_id, start, end, x)
    return x


@settings(max_examples=100, deadline=None)
@given(split=partitions(), prompt=prompts, model_id=model_ids)
def test_any_split_matches_the_unsplit_run_and_the_reference(
    split: tuple[int, list[tuple[int, int]]], prompt: str, model_id: str
) -> None:
    layers, ranges = split
    model = ToyModel()
    x = model.embed(model_id, prompt)
    whole = model.run(model_id, 0, layers, x)
    # Each stage on its own instance: a node hosting one range shares no cache with others.
    piped = x
    for start, end in ranges:
        piped = ToyModel().run(model_id, start, end, piped)
    assert piped == whole
    assert through(model, model_id, ranges, x) == whole
    text = model.decode(model_id, layers, piped, 16)
    assert text == reference(model_id, layers, prompt, 16)


@settings(max_examples=50, deadline=None)
@given(prompt=prompts, layers=st.integers(min_value=1, max_value=32))
def test_a_fresh_instance_recomputes_identical_bytes(prompt: str, layers: int) -> None:
    warm = ToyModel()
    warm.run(MODEL, 0, layers, warm.embed(MODEL, "warm the cache first"))
    a = warm.run(MODEL, 0, layers, warm.embed(MODEL, prompt))
    cold = ToyModel()
    assert cold.cached_layers == 0
    assert cold.embed(MODEL, prompt) == warm.embed(MODEL, prompt)
    assert cold.run(MODEL, 0, layers, cold.embed(MODEL, prompt)) == a


def test_model_id_seed_and_prompt_each_change_the_output() -> None:
    base = reference(MODEL, 6, PROMPT, 32)
    assert reference("other-model", 6, PROMPT, 32) != base
    assert reference(MODEL, 6, PROMPT, 32, seed=1) != base
    assert reference(MODEL, 6, PROMPT + "!", 32) != base
    x = ToyModel().embed(MODEL, PROMPT)
    assert ToyModel().run("other-model", 0, 6, x) != ToyModel().run(MODEL, 0, 6, x)
    assert ToyModel(seed=1).run(MODEL, 0, 6, x) != ToyModel().run(MODEL, 0, 6, x)


_CHILD = """
import json, sys
from hecate.model.toy import ToyModel, reference
m = ToyModel()
x = m.run(sys.argv[1], 0, 12, m.embed(sys.argv[1], sys.argv[2]))
print(json.dumps({
    "text": reference(sys.argv[1], 12, sys.argv[2], 64),
    "activation": x.hex(),
    "hash": hash(sys.argv[1]),
}))
"""


def test_a_separate_process_with_another_hash_seed_computes_the_same_reference() -> None:
    own_seed = os.environ.get("PYTHONHASHSEED")
    child_seed = str(random.randrange(1, 2**32))
    while child_seed == own_seed:
        child_seed = str(random.randrange(1, 2**32))
    shared = str(Path(hecate.model.__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (shared, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONHASHSEED": child_seed, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, MODEL, PROMPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    child = json.loads(done.stdout)
    # The child really did salt str hashes differently, so hash() would have diverged.
    assert child["hash"] != hash(MODEL)
    m = ToyModel()
    assert child["activation"] == m.run(MODEL, 0, 12, m.embed(MODEL, PROMPT)).hex()
    assert child["text"] == reference(MODEL, 12, PROMPT, 64)


def test_activation_is_hidden_float32_little_endian() -> None:
    model = ToyModel()
    x = model.embed(MODEL, PROMPT)
    assert len(x) == 64 * 4 == model.activation_bytes
    assert len(model.run(MODEL, 0, 3, x)) == 64 * 4
    values = np.frombuffer(x, dtype="<f4")
    assert np.isfinite(values).all()
    assert float(np.sqrt(np.mean(values.astype(np.float64) ** 2))) == pytest.approx(1.0, 1e-5)
    wide = ToyModel(hidden=16)
    assert len(wide.run(MODEL, 0, 2, wide.embed(MODEL, PROMPT))) == 16 * 4


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x00" * 255, b"\x00" * 257, b"\x00" * 128, np.zeros(64, "<f8").tobytes()],
)
def test_a_wrong_size_activation_is_bad_activation(payload: bytes) -> None:
    model = ToyModel()
    with pytest.raises(ExecutorError) as err:
        model.run(MODEL, 0, 1, payload)
    assert err.value.code == "bad_activation"
    with pytest.raises(ExecutorError) as err:
        model.decode(MODEL, 1, payload, 4)
    assert err.value.code == "bad_activation"


def test_non_finite_or_non_bytes_activation_is_bad_activation() -> None:
    model = ToyModel()
    nan = np.full(64, np.nan, dtype="<f4").tobytes()
    with pytest.raises(ExecutorError, match="bad_activation"):
        model.run(MODEL, 0, 1, nan)
    with pytest.raises(ExecutorError, match="bad_activation"):
        model.run(MODEL, 0, 1, "x" * 256)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("start", "end"), [(-1, 2), (3, 3), (4, 2), (0, MAX_LAYERS + 1), (MAX_LAYERS, MAX_LAYERS + 1)]
)
def test_bad_ranges_are_bad_range(start: int, end: int) -> None:
    model = ToyModel()
    x = model.embed(MODEL, PROMPT)
    with pytest.raises(ExecutorError) as err:
        model.run(MODEL, start, end, x)
    assert err.value.code == "bad_range"
    assert err.value.to_dict()["code"] == "bad_range"


def test_decode_rejects_a_bad_depth_or_token_count() -> None:
    model = ToyModel()
    x = model.embed(MODEL, PROMPT)
    for layers in (0, -1, MAX_LAYERS + 1):
        with pytest.raises(ExecutorError) as err:
            model.decode(MODEL, layers, x, 1)
        assert err.value.code == "bad_range"
    for tokens in (-1, MAX_TOKENS + 1):
        with pytest.raises(ExecutorError) as err:
            model.decode(MODEL, 1, x, tokens)
        assert err.value.code == "bad_max_tokens"


def test_an_unknown_executor_lists_the_known_ones() -> None:
    with pytest.raises(ExecutorError) as err:
        get_executor("gpt-17")
    assert err.value.code == "unknown_executor"
    assert "toy" in err.value.message
    toy = get_executor("toy")
    assert isinstance(toy, ToyModel)
    assert isinstance(toy, Executor)
    assert toy.name == "toy"
    assert "toy" in EXECUTORS


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(
        st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=64, max_size=64
    ),
    tokens=st.integers(min_value=0, max_value=300),
)
def test_decode_is_deterministic_with_exactly_max_tokens_words(
    values: list[float], tokens: int
) -> None:
    x = np.asarray(values, dtype="<f4").tobytes()
    text = ToyModel().decode(MODEL, 5, x, tokens)
    assert text == ToyModel(seed=9).decode("another-model", 7, x, tokens)
    words = text.split(" ") if text else []
    assert len(words) == tokens
    assert all(w in VOCABULARY for w in words)


def test_decode_edge_counts() -> None:
    model = ToyModel()
    x = model.run(MODEL, 0, 4, model.embed(MODEL, PROMPT))
    assert model.decode(MODEL, 4, x, 0) == ""
    assert len(model.decode(MODEL, 4, x, MAX_TOKENS).split(" ")) == MAX_TOKENS
    # A prefix property: asking for more tokens extends, never rewrites, the text.
    assert model.decode(MODEL, 4, x, 20).startswith(model.decode(MODEL, 4, x, 10))
    assert len(set(model.decode(MODEL, 4, x, 200).split())) > 50  # not one repeated word


def test_the_weight_cache_is_bounded_and_does_not_change_results() -> None:
    small = ToyModel(cache_layers=3)
    x = small.embed(MODEL, PROMPT)
    once = small.run(MODEL, 0, 10, x)
    assert small.cached_layers == 3
    assert small.run(MODEL, 0, 10, x) == once
    assert ToyModel(cache_layers=0).run(MODEL, 0, 10, x) == once
    assert ToyModel(cache_layers=0).cached_layers == 0


def test_constructor_rejects_unusable_parameters() -> None:
    for kwargs in ({"seed": -1}, {"seed": 2**32}, {"hidden": 0}, {"cache_layers": -1}):
        with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
            ToyModel(**kwargs)


def test_the_vocabulary_is_256_distinct_words() -> None:
    # One digest byte indexes it, so exactly 256 keeps every word equally likely.
    assert len(VOCABULARY) == 256
    assert len(set(VOCABULARY)) == 256
