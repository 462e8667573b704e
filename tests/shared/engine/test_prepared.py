"""The prepared folder beside a GGUF: built once, memory-mapped after, rebuilt when the
GGUF changes, and never trusted half-written."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hecate.llm.gguf_model import Prepared


def test_a_matrix_is_built_once_then_memory_mapped(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"v1")
    calls: list[int] = []

    def build() -> np.ndarray:
        calls.append(1)
        return np.arange(6, dtype=np.float32).reshape(2, 3)

    first = Prepared(gguf).get("w", build)
    again = Prepared(gguf).get("w", build)
    assert len(calls) == 1
    assert isinstance(again, np.memmap)
    assert np.array_equal(first, again)
    assert Prepared(gguf).text("config.json", lambda: "{}") == "{}"
    assert Prepared(gguf).text("config.json", lambda: "changed") == "{}"


def test_a_changed_gguf_rebuilds_everything(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"v1")
    Prepared(gguf).get("w", lambda: np.zeros(3, dtype=np.float32))
    gguf.write_bytes(b"version 2")  # another size: another file
    rebuilt = Prepared(gguf).get("w", lambda: np.ones(3, dtype=np.float32))
    assert np.array_equal(rebuilt, np.ones(3, dtype=np.float32))


def test_a_torn_file_is_rebuilt(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"v1")
    prepared = Prepared(gguf)
    prepared.get("w", lambda: np.zeros(3, dtype=np.float32))
    (prepared.folder / "w.npy").write_bytes(b"\x93NUMPY garbage")
    again = Prepared(gguf).get("w", lambda: np.full(3, 7, dtype=np.float32))
    assert np.array_equal(again, np.full(3, 7, dtype=np.float32))
