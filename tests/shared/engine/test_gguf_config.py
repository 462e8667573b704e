"""Which layers of a sliding-window model slide, and on which RoPE base, as llama.cpp
reads the header: the defaults a real Gemma 3 file relies on (its converter writes no
pattern and not always the base), a pattern of its own, and none."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from hecate.llm.gguf_config import SLIDING_ROPE_BASE, read_config
from hecate.llm.gguf_file import GGUFFile
from hecate_dev.synthetic_gguf import Shape, write

SMALL = Shape(layers=7, hidden=64, heads=2, kv_heads=1, ffn=64, vocab=32, arch="gemma3")
T, F = True, False


@pytest.mark.parametrize(
    ("pattern", "sliding"),
    [
        (None, (T, T, T, T, T, F, T)),  # llama.cpp's default: every sixth layer global
        (2, (T, F, T, F, T, F, T)),
        (0, (T,) * 7),  # every layer slides
    ],
)
def test_the_sliding_layers_are_llama_cpp_s(
    pattern: int | None, sliding: tuple[bool, ...], tmp_path: Path
) -> None:
    shape = Shape(**{**SMALL.__dict__, "window": 8, "window_pattern": pattern})
    c = read_config(GGUFFile(write(tmp_path / "m.gguf", Q.F32, shape)))
    assert (c.window, c.sliding_layers) == (8, sliding)
    assert [c.slides(i) for i in range(7)] == list(sliding)
    assert c.rope_base_swa == SLIDING_ROPE_BASE  # not written: llama.cpp's default
    assert (c.embed_scale, c.gelu, c.post_norms, c.qk_norm) == (8.0, True, True, True)


def test_no_window_no_sliding_layer(tmp_path: Path) -> None:
    c = read_config(GGUFFile(write(tmp_path / "m.gguf", Q.F32, SMALL)))
    assert (c.window, c.sliding_layers) == (0, ())
    assert not any(c.slides(i) for i in range(7))
