"""The engine's KV cache: float16 by default, as llama.cpp keeps it (half float32's
bytes), float32 where the graph is built for it; a stage says its own bytes a position
(synthetic models of random weights, real runtime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from onnx import TensorProto

from hecate.llm import onnx_graph, onnx_load
from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import LlamaConfig, load_stage, read_config
from hecate.llm.kv_pool import KvType
from hecate.llm.llama import LlamaStage
from hecate.llm.onnx_stage import OnnxStage
from hecate.llm.sessions import (
    FULL_CONTEXT_SESSIONS,
    Sessions,
    default_max_bytes,
    kv_bytes_per_position,
    kv_itemsize,
)
from hecate_dev.synthetic_gguf import write

PROMPT = [1, 5, 9, 33, 100, 200, 7, 300]


def built_with(monkeypatch: pytest.MonkeyPatch, kv_type: KvType) -> None:
    """Graphs built with a KV cache of ``kv_type`` whatever the stage asks: a graph and a
    stage that disagree."""

    def build(
        file: GGUFFile, c: LlamaConfig, a: int, b: int, capacity: int, _asked: KvType
    ) -> onnx_graph.Built:
        return onnx_graph.build(file, c, a, b, capacity, kv_type)

    monkeypatch.setattr(onnx_load, "build", build)


def test_the_cache_is_float16_by_default_and_costs_half_float32_s(tmp_path: Path) -> None:
    stage = OnnxStage(write(tmp_path / "m.gguf", Q.Q4_0), 0, 3, threads=1, slots=2, capacity=64)
    c = stage.config
    assert stage.kv_type is np.float16
    assert stage.kv_itemsize == kv_itemsize(stage) == 2
    assert {pool.dtype for pool in (*stage._k, *stage._v)} == {np.dtype(np.float16)}
    per_position = kv_bytes_per_position(c, 3, 2)
    assert per_position == 2 * 3 * c.kv_heads * c.head_dim * 2
    assert stage.new_cache().bytes_per_position == per_position
    assert Sessions(stage).max_bytes == FULL_CONTEXT_SESSIONS * c.context * per_position
    # The numpy model keeps float32: 4 bytes a number, twice the engine's.
    numpy_model = LlamaStage(load_stage(tmp_path / "m.gguf", 0, 3))
    assert kv_itemsize(numpy_model) == 4
    assert default_max_bytes(numpy_model) == 2 * default_max_bytes(stage)


def test_a_float32_cache_asked_of_a_float16_graph_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built_with(monkeypatch, np.float16)
    with pytest.raises(ValueError, match="float32 asked, the graph keeps float16"):
        OnnxStage(write(tmp_path / "m.gguf", Q.Q4_0), 0, 3, threads=1, kv_type=np.float32)


def test_float32_and_float16_caches_give_the_same_tokens(tmp_path: Path) -> None:
    """On float weights (no int8 activations to turn float16's rounding into another draw
    of their own) the two caches' logits differ by float16's rounding alone: the same
    greedy tokens, logits within 0.01 (0.002 measured)."""
    path = write(tmp_path / "m.gguf", Q.F16)
    half = OnnxStage(path, 0, 3, threads=1, slots=1, capacity=64)
    full = OnnxStage(path, 0, 3, threads=1, slots=1, capacity=64, kv_type=np.float32)
    assert full.kv_itemsize == 4
    assert {pool.dtype for pool in (*full._k, *full._v)} == {np.dtype(np.float32)}
    slots = [half.new_cache(), full.new_cache()]
    tokens = PROMPT
    for _ in range(8):
        a, b = (
            s.forward_batch([s.embed(tokens)], [slot])[0][0]
            for s, slot in zip((half, full), slots, strict=True)
        )
        np.testing.assert_allclose(a, b, rtol=0, atol=0.01)
        assert int(np.argmax(a)) == int(np.argmax(b))
        tokens = [int(np.argmax(b))]


def test_a_float16_graph_casts_around_the_attention_alone(tmp_path: Path) -> None:
    """Q, K and V go into the attention in float16, its output comes back as float32,
    and nothing else of the graph changes type."""
    file = GGUFFile(write(tmp_path / "m.gguf", Q.Q4_0))
    c = read_config(file)
    kinds: dict[KvType, list[str]] = {}
    for kv_type in (np.float16, np.float32):
        built = onnx_graph.build(file, c, 0, 3, 64, kv_type=kv_type)
        kinds[kv_type] = [n.op_type for n in built.model.graph.node]
        past = [i for i in built.model.graph.input if i.name.startswith("past_")]
        want = TensorProto.FLOAT16 if kv_type is np.float16 else TensorProto.FLOAT
        assert {i.type.tensor_type.elem_type for i in past} == {want}
    assert kinds[np.float32].count("Cast") == 0
    assert kinds[np.float16].count("Cast") == 2 * c.layers
    assert [k for k in kinds[np.float16] if k != "Cast"] == kinds[np.float32]
