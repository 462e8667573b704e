"""A stage loaded in pieces: where the range is cut, what each piece keeps, and that the
numbers are those of the range in one piece."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given
from hypothesis import strategies as st

from hecate.llm import onnx_load
from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import read_config
from hecate.llm.onnx_graph import ROLES
from hecate.llm.onnx_load import cuts, left_unread, stage_bytes
from hecate.llm.onnx_stage import OnnxStage
from hecate_dev.synthetic_gguf import Shape, write


@given(st.lists(st.integers(1, 100), max_size=40), st.integers(1, 300))
def test_the_cuts_cover_the_range_in_order_within_the_budget(sizes: list[int], budget: int) -> None:
    pieces = cuts(sizes, budget)
    assert [i for a, b in pieces for i in range(a, b)] == list(range(len(sizes)))
    for a, b in pieces:
        assert b > a
        assert b - a == 1 or sum(sizes[a:b]) <= budget
    for (a, _), (c, _) in itertools.pairwise(pieces):
        assert sum(sizes[a : c + 1]) > budget  # a piece ends only where the next would not fit


def test_the_probe_finds_what_the_runtime_reads_no_more() -> None:
    for bits in (4, 8):
        unread = left_unread(bits, 32)
        assert unread <= set(ROLES)
        # Whatever else it keeps, the packed kernels of this CPU hold their own integers
        # (every CPU this engine is measured on; a CPU without them is slow anyway).
        assert "q" in unread


def test_a_stage_in_pieces_computes_the_numbers_of_one_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "m.gguf", Q.Q4_K, Shape(layers=4, hidden=256, ffn=512))
    whole = OnnxStage(path, 0, 4, threads=1, slots=2, capacity=64)
    monkeypatch.setattr(onnx_load, "PIECE_BYTES", 1)  # a piece a block
    pieces = OnnxStage(path, 0, 4, threads=1, slots=2, capacity=64)
    assert len(whole.pieces) == 1
    assert [(p.layer_start, p.layer_end) for p in pieces.pieces] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    prompt = [1, 5, 9, 33, 100, 200, 7, 300]
    slots = [whole.new_cache(), pieces.new_cache()]
    for step in range(6):
        tokens = prompt if step == 0 else [step * 11]
        a, b = (
            s.forward_batch([s.embed(tokens)], [slot])[0]
            for s, slot in zip((whole, pieces), slots, strict=True)
        )
        assert np.array_equal(a, b), step


def test_a_stage_reads_the_bytes_of_its_own_tensors(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf", Q.Q4_0, Shape(layers=4, tied=False))
    file = GGUFFile(path)
    c = read_config(file)
    total = sum(t.data.nbytes for t in file.tensors.values())
    parts = [stage_bytes(file, c, a, b) for a, b in ((0, 1), (1, 3), (3, 4))]
    assert sum(parts) == total  # every tensor once: the embedding first, the head last
    assert stage_bytes(file, c, 0, 4) == total
