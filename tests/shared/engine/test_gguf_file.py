"""The light GGUF reader against ``gguf``'s own, and on files that are not whole GGUFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hecate.llm.gguf_file import BadGGUF, GGUFFile
from hecate.llm.gguf_model import UnsupportedModel, read_config
from hecate_dev.synthetic_gguf import Shape, write


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    return write(path, Q.Q4_K, Shape(layers=1, arch="qwen2", rope_scaling="llama3", tied=False))


@pytest.mark.parametrize("kind", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_1, Q.Q6_K], ids=lambda q: q.name)
def test_it_reads_what_gguf_s_reader_reads(kind: Q, tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf", kind, Shape(layers=1))
    mine, theirs = GGUFFile(path), GGUFReader(path)
    assert sorted(mine.tensors) == sorted(t.name for t in theirs.tensors)
    for t in theirs.tensors:
        m = mine.tensors[t.name]
        assert m.shape == tuple(int(s) for s in t.shape)
        assert m.tensor_type == t.tensor_type
        assert m.data.dtype == t.data.dtype
        np.testing.assert_array_equal(m.data, t.data)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's own entries for the header
        value = field.parts[field.data[0]] if len(field.data) == 1 else None
        if value is not None and value.dtype == np.uint8:
            assert mine.metadata[key] == bytes(value).decode()
        elif value is not None:
            assert mine.metadata[key] == value.tolist()[0]


def test_a_config_holds_what_a_qwen2_or_llama3_file_says(small: Path) -> None:
    c = read_config(GGUFFile(small))
    assert (c.arch, c.rope_interleaved, c.qkv_bias, c.tied_head) == ("qwen2", False, True, False)
    assert c.rope_factors is not None
    assert len(c.rope_factors) == c.head_dim // 2
    assert max(c.rope_factors) > 1.0


def test_an_architecture_it_does_not_run_is_named(small: Path, tmp_path: Path) -> None:
    raw = small.read_bytes().replace(b"qwen2", b"mamba", 1)
    other = tmp_path / "mamba.gguf"
    other.write_bytes(raw)
    with pytest.raises(UnsupportedModel, match="architecture 'mamba' is not supported"):
        read_config(GGUFFile(other))


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "empty"),
        (b"PK\x03\x04 a zip file", "not a GGUF file"),
        (b"GGUF\x07\x00\x00\x00" + bytes(16), "version 7"),
    ],
)
def test_what_is_not_a_gguf_is_refused_naming_the_file(
    content: bytes, says: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(BadGGUF, match=says) as raised:
        GGUFFile(path)
    assert str(path) in str(raised.value)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.floats(0.0, 0.999))
def test_a_file_cut_anywhere_is_refused_not_misread(
    small: Path, tmp_path: Path, cut: float
) -> None:
    raw = small.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(raw[: max(1, int(len(raw) * cut))])
    with pytest.raises(BadGGUF):
        GGUFFile(path)
