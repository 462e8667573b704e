"""The float32 weights of a llama-family GGUF's layer range, for the numpy model.

What the header says (the architecture, its hyper-parameters and each tensor's shape)
is read by :mod:`hecate.llm.gguf_config`, whose names this module also gives.

A stage loads only what it runs: its blocks, plus the token embedding on the first
stage and the final norm and output head on the last. Weights are dequantised
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

import functools
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf.quants import dequantize

from hecate.llm.gguf_config import ARCHITECTURES, LIMITS, LlamaConfig, UnsupportedModel, read_config
from hecate.llm.gguf_file import GGUFFile, Tensor
from hecate.llm.gguf_shapes import BLOCK_TENSORS, check_shapes

__all__ = [
    "ARCHITECTURES",
    "BLOCK_TENSORS",
    "LIMITS",
    "Block",
    "LlamaConfig",
    "Prepared",
    "StageWeights",
    "UnsupportedModel",
    "check_shapes",
    "load_stage",
    "model_config",
    "prepare",
    "read_config",
]

Matrix = npt.NDArray[np.float32]


@dataclass
class Block:
    attn_norm: Matrix
    wqkv: Matrix  # [hidden, (heads + 2·kv_heads)·head_dim]
    wo: Matrix  # [heads·head_dim, hidden]
    ffn_norm: Matrix
    w_gate_up: Matrix | None  # [hidden, 2·ffn] (None: experts instead)
    w_down: Matrix | None  # [ffn, hidden]
    bqkv: Matrix | None = None  # [(heads + 2·kv_heads)·head_dim] (qwen2)
    q_norm: Matrix | None = None  # [head_dim] (qwen3, gemma3)
    k_norm: Matrix | None = None
    post_attn_norm: Matrix | None = None  # [hidden] (gemma3)
    post_ffn_norm: Matrix | None = None
    router: Matrix | None = None  # [hidden, experts] (a mixture of experts)
    experts_gate_up: Matrix | None = None  # [experts, hidden, 2·expert_ffn]
    experts_down: Matrix | None = None  # [experts, expert_ffn, hidden]


@dataclass
class StageWeights:
    config: LlamaConfig
    layer_start: int
    layer_end: int
    blocks: list[Block]
    embedding: Matrix | None  # [vocab, hidden]: first stage
    output_norm: Matrix | None  # last stage
    head: Matrix | None = None  # [vocab, hidden]: last stage (the embedding when tied)


def _matrix(tensor: Tensor) -> Matrix:
    """Dequantised as [out, in] (GGUF row order)."""
    return np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)


class Prepared:
    """What a GGUF yields once worked out, kept in ``<file>.f32/``: float32 matrices
    (memory-mapped back) and the tokenizer (built from 98,000 strings of metadata)."""

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
    """The hyper-parameters (reading a GGUF's header takes milliseconds)."""
    return read_config(GGUFFile(path))


def load_stage(path: Path, layer_start: int, layer_end: int) -> StageWeights:
    prepared = Prepared(path)
    file = functools.cache(lambda: GGUFFile(path))  # only when something is missing
    config = model_config(path)
    if not 0 <= layer_start < layer_end <= config.layers:
        raise ValueError(f"layer range [{layer_start}, {layer_end}) outside 0..{config.layers}")

    def t(name: str, part: str = "weight") -> Matrix:
        return _matrix(file().tensors[f"{name}.{part}"])

    def flat(name: str) -> Callable[[], Matrix]:
        return lambda: t(name).reshape(-1)

    def as_is(name: str) -> Callable[[], Matrix]:
        return lambda: t(name)

    def stacked_t(*names: str) -> Callable[[], Matrix]:
        """The tensors stacked along their outputs, as [in, out] (fused matmuls)."""
        return lambda: np.concatenate([t(n) for n in names], axis=0).T

    def biases(*names: str) -> Callable[[], Matrix]:
        return lambda: np.concatenate([t(n, "bias").reshape(-1) for n in names])

    def experts(b: str) -> dict[str, Matrix]:
        """A block's router [in, experts], and its experts' gate and up [experts, in,
        2·width] (the gate first) and down [experts, width, out]."""
        gate_up = (f"{b}.ffn_gate_exps", f"{b}.ffn_up_exps")
        return {
            "router": prepared.get(f"{b}.router", stacked_t(f"{b}.ffn_gate_inp")),
            "experts_gate_up": prepared.get(
                f"{b}.experts_gate_up",
                lambda: np.concatenate([t(n) for n in gate_up], axis=1).transpose(0, 2, 1),
            ),
            "experts_down": prepared.get(
                f"{b}.experts_down", lambda: t(f"{b}.ffn_down_exps").transpose(0, 2, 1)
            ),
        }

    moe = config.experts > 0
    blocks = []
    for i in range(layer_start, layer_end):
        b = f"blk.{i}"
        qkv = (f"{b}.attn_q", f"{b}.attn_k", f"{b}.attn_v")
        fused_qkv = (f"{b}.attn_qkv",) if config.fused else qkv
        gate_up = (f"{b}.ffn_up",) if config.fused else (f"{b}.ffn_gate", f"{b}.ffn_up")
        blocks.append(
            Block(
                attn_norm=prepared.get(f"{b}.attn_norm", flat(f"{b}.attn_norm")),
                wqkv=prepared.get(f"{b}.wqkv", stacked_t(*fused_qkv)),
                wo=prepared.get(f"{b}.wo", stacked_t(f"{b}.attn_output")),
                ffn_norm=prepared.get(f"{b}.ffn_norm", flat(f"{b}.ffn_norm")),
                w_gate_up=None if moe else prepared.get(f"{b}.w_gate_up", stacked_t(*gate_up)),
                w_down=None if moe else prepared.get(f"{b}.w_down", stacked_t(f"{b}.ffn_down")),
                bqkv=prepared.get(f"{b}.bqkv", biases(*qkv)) if config.qkv_bias else None,
                **{
                    field: prepared.get(f"{b}.{name}", flat(f"{b}.{name}"))
                    for field, name, wanted in (
                        ("q_norm", "attn_q_norm", config.qk_norm),
                        ("k_norm", "attn_k_norm", config.qk_norm),
                        ("post_attn_norm", "post_attention_norm", config.post_norms),
                        ("post_ffn_norm", "post_ffw_norm", config.post_norms),
                    )
                    if wanted
                },
                **({} if not moe else experts(b)),
            )
        )
    last = layer_end == config.layers
    embedding = prepared.get("token_embd", as_is("token_embd")) if layer_start == 0 else None
    head = None
    if last:
        name = "token_embd" if config.tied_head else "output"
        head = prepared.get(name, as_is(name))
    output_norm = prepared.get("output_norm", flat("output_norm")) if last else None
    return StageWeights(config, layer_start, layer_end, blocks, embedding, output_norm, head)


def prepare(path: Path, *, float32: bool = False) -> None:
    """Build the prepared folder now (``hecate up`` does, before nodes start): the
    tokenizer, and with ``float32`` the reference's weights (the engine reads the GGUF's
    own blocks: it needs none)."""
    from hecate.llm.tokenizer import load_tokenizer

    if float32:
        load_stage(path, 0, model_config(path).layers)
    load_tokenizer(path)
