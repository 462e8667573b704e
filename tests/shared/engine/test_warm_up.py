"""The generative executor's warm-up pass: it runs every kind of range (first, middle,
last) and leaves no KV cache behind, nor disturbs a session already held."""

from __future__ import annotations

from pathlib import Path

import pytest

from hecate.llm.executor import LlmExecutor
from hecate.llm.store import pull
from hecate.model.executor import WarmsUp

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

RANGES = [(0, 10), (10, 20), (20, 30)]


@pytest.fixture(scope="module")
def gguf() -> Path:
    return pull("smollm2-135m", progress=lambda _line: None)


def test_a_warm_up_runs_each_range_and_leaves_no_session_behind(gguf: Path) -> None:
    llm = LlmExecutor(path=gguf)
    assert isinstance(llm, WarmsUp)
    llm.prepare(RANGES[:2])  # the last range is loaded by its warm-up, as a stage would
    assert llm._tokenizer is not None  # loaded with the first stage, not on the timed pass
    first = llm._ranges[RANGES[0]]
    ids = llm.tokenizer().encode("Gravity is").ids
    held = first.step("live", 0, tokens=ids)  # a generation in progress on this node
    live = first.caches["live"][0]
    for start, end in RANGES:
        llm.warm_up("smollm2-135m", start, end)
    assert set(llm._ranges) == set(RANGES)
    assert list(first.caches) == ["live"]
    assert first.caches["live"][0] is live
    assert live.length == len(ids)
    assert all(not llm._ranges[r].caches for r in RANGES[1:])
    # The session carries on where it was: the next position is still its own.
    after = first.step("live", len(ids), tokens=[ids[-1]])
    assert after.shape == (1, held.shape[1])
