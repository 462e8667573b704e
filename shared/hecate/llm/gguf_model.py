"""Reading a llama-architecture GGUF: hyper-parameters, and the tensors of a layer range.

A stage loads only what it runs: its blocks, plus the token embedding on the first
stage and the final norm and (tied) output head on the last. Weights are dequantised
to float32 once, stored contiguous as ``[in, out]`` so that ``x @ W`` reads them in
order, with Q/K/V and gate/up fused into one matrix each (one matmul instead of three
or two: decode is memory-bandwidth bound).

Dequantising is CPU work (about 0.7 s for ten blocks); six stage processes doing it at
once on two cores starve their own heartbeats and telemetry declares them down while
they load. So each prepared matrix is also kept beside the GGUF as ``.npy``
(``<file>.f32/``, about 540 MB for SmolLM2) and later loads memory-map it: instant, and
nodes holding the same range on one machine share the pages. The folder is rebuilt
when the GGUF's size or modification time changes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader
from gguf.quants import dequantize

Matrix = npt.NDArray[np.float32]


@dataclass(frozen=True)
class LlamaConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    rope_base: float
    vocab: int
    context: int


@dataclass
class Block:
    attn_norm: Matrix
    wqkv: Matrix  # [hidden, (heads + 2·kv_heads)·head_dim]
    wo: Matrix  # [hidden, hidden]
    ffn_norm: Matrix
    w_gate_up: Matrix  # [hidden, 2·ffn]
    w_down: Matrix  # [ffn, hidden]


@dataclass
class StageWeights:
    config: LlamaConfig
    layer_start: int
    layer_end: int
    blocks: list[Block]
    embedding: Matrix | None  # [vocab, hidden]: first stage (and the tied head)
    output_norm: Matrix | None  # last stage


def _field(reader: GGUFReader, key: str) -> Any:
    field = reader.fields[key]
    value = field.parts[field.data[0]]
    if value.dtype == np.uint8:
        return bytes(value).decode()
    return value.tolist()[0]


def read_config(reader: GGUFReader) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported architecture {arch!r}")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    return LlamaConfig(
        layers=int(_field(reader, "llama.block_count")),
        hidden=hidden,
        heads=heads,
        kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // heads,
        ffn=int(_field(reader, "llama.feed_forward_length")),
        eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_base=float(_field(reader, "llama.rope.freq_base")),
        vocab=int(_field(reader, "llama.vocab_size")),
        context=int(_field(reader, "llama.context_length")),
    )


def _matrix(tensor: Any) -> Matrix:
    """Dequantised as [out, in] (GGUF row order)."""
    return np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)


class Prepared:
    """What a GGUF yields once worked out, kept in ``<file>.f32/``: float32 matrices
    (memory-mapped back), the config and the tokenizer (parsing the GGUF's metadata
    alone takes seconds of pure Python)."""

    def __init__(self, path: Path) -> None:
        self.folder = path.with_name(path.name + ".f32")
        stat = path.stat()
        stamp = json.dumps({"size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
        marker = self.folder / "source.json"
        try:
            current = marker.read_text() == stamp
        except OSError:
            current = False
        if not current:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder.mkdir(parents=True, exist_ok=True)
            marker.write_text(stamp)

    def text(self, name: str, build: Callable[[], str]) -> str:
        file = self.folder / name
        try:
            return file.read_text()
        except OSError:
            pass
        value = build()
        partial = self.folder / f".{name}.{os.getpid()}"
        try:
            partial.write_text(value)
            partial.replace(file)
        except OSError:
            partial.unlink(missing_ok=True)
        return value

    def get(self, name: str, build: Callable[[], Matrix]) -> Matrix:
        file = self.folder / f"{name}.npy"
        try:
            loaded: Matrix = np.load(file, mmap_mode="r")
            return loaded
        except (OSError, ValueError):  # not there yet (or torn by a crash): build it
            pass
        matrix = np.ascontiguousarray(build(), dtype=np.float32)
        partial = self.folder / f".{name}.{os.getpid()}.npy"
        try:
            np.save(partial, matrix)
            partial.replace(file)  # atomic: another process never sees half a file
        except OSError:
            partial.unlink(missing_ok=True)  # a read-only cache: just use it from memory
        return matrix


def model_config(path: Path) -> LlamaConfig:
    """The hyper-parameters, from the prepared folder when it has them."""
    built = Prepared(path).text(
        "config.json", lambda: json.dumps(dataclasses.asdict(read_config(GGUFReader(path))))
    )
    return LlamaConfig(**json.loads(built))


def load_stage(path: Path, layer_start: int, layer_end: int) -> StageWeights:
    prepared = Prepared(path)
    reader = functools.cache(lambda: GGUFReader(path))  # only when something is missing
    config = model_config(path)
    if not 0 <= layer_start < layer_end <= config.layers:
        raise ValueError(f"layer range [{layer_start}, {layer_end}) outside 0..{config.layers}")

    def t(name: str) -> Matrix:
        tensor = next(x for x in reader().tensors if x.name == f"{name}.weight")
        return _matrix(tensor)

    def flat(name: str) -> Callable[[], Matrix]:
        return lambda: t(name).reshape(-1)

    def as_is(name: str) -> Callable[[], Matrix]:
        return lambda: t(name)

    def stacked_t(*names: str) -> Callable[[], Matrix]:
        """The tensors stacked along their outputs, as [in, out] (fused matmuls)."""
        return lambda: np.concatenate([t(n) for n in names], axis=0).T

    blocks = []
    for i in range(layer_start, layer_end):
        b = f"blk.{i}"
        blocks.append(
            Block(
                attn_norm=prepared.get(f"{b}.attn_norm", flat(f"{b}.attn_norm")),
                wqkv=prepared.get(
                    f"{b}.wqkv", stacked_t(f"{b}.attn_q", f"{b}.attn_k", f"{b}.attn_v")
                ),
                wo=prepared.get(f"{b}.wo", stacked_t(f"{b}.attn_output")),
                ffn_norm=prepared.get(f"{b}.ffn_norm", flat(f"{b}.ffn_norm")),
                w_gate_up=prepared.get(f"{b}.w_gate_up", stacked_t(f"{b}.ffn_gate", f"{b}.ffn_up")),
                w_down=prepared.get(f"{b}.w_down", stacked_t(f"{b}.ffn_down")),
            )
        )
    last = layer_end == config.layers
    embedding = (
        prepared.get("token_embd", as_is("token_embd")) if layer_start == 0 or last else None
    )
    output_norm = prepared.get("output_norm", flat("output_norm")) if last else None
    return StageWeights(config, layer_start, layer_end, blocks, embedding, output_norm)


def prepare(path: Path) -> None:
    """Build the whole prepared folder now (``hecate up`` does, before nodes start)."""
    from hecate.llm.tokenizer import load_tokenizer

    load_stage(path, 0, model_config(path).layers)
    load_tokenizer(path)
