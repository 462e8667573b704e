"""A node's sessions on the engine, whose KV cache has a fixed number of places: a new
session takes the least recently used idle one's place, never one stepping in the same
batch, and says so when there is none (on a small synthetic model, real runtime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from hecate.dev.synthetic_gguf import write
from hecate.llm.onnx_stage import OnnxStage
from hecate.llm.sessions import Sessions, Step
from hecate.model.executor import ExecutorError


@pytest.fixture
def stage(tmp_path: Path) -> OnnxStage:
    return OnnxStage(write(tmp_path / "m.gguf", Q.Q4_0), 0, 3, threads=1, slots=2, capacity=64)


def test_a_new_session_takes_the_idle_place_and_the_evicted_one_must_replay(
    stage: OnnxStage,
) -> None:
    sessions = Sessions(stage)
    sessions.step("a", 0, tokens=[1, 2, 3])
    sessions.step("b", 0, tokens=[4, 5])
    sessions.step("a", 3, tokens=[6])  # a is now the more recent
    sessions.step("c", 0, tokens=[7])  # no place left: b, the least recently used, goes
    assert set(sessions.caches) == {"a", "c"}
    with pytest.raises(ExecutorError) as lost:
        sessions.step("b", 2, tokens=[8])
    assert lost.value.code == "session_lost"


def test_a_batch_wider_than_the_places_refuses_only_the_step_without_one(
    stage: OnnxStage,
) -> None:
    sessions = Sessions(stage)
    out = sessions.step_batch([Step(s, 0, tokens=[1, 2]) for s in ("a", "b", "c")])
    assert [isinstance(o, np.ndarray) for o in out] == [True, True, False]
    refused = out[2]
    assert isinstance(refused, ExecutorError)
    assert refused.code == "rate_limited"
    assert refused.retry_after_s is not None


def test_closing_a_session_gives_its_place_back(stage: OnnxStage) -> None:
    sessions = Sessions(stage)
    for name in ("a", "b"):
        sessions.step(name, 0, tokens=[1])
    sessions.close("a")
    sessions.step("c", 0, tokens=[1])
    assert set(sessions.caches) == {"b", "c"}
