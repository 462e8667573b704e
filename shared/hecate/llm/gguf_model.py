"""Reading a llama-architecture GGUF: hyper-parameters, and the tensors of a layer range.

A stage loads only what it runs: its blocks, plus the token embedding on the first
stage and the final norm and (tied) output head on the last. Weights are dequantised
to float32 once, stored contiguous as ``[in, out]`` so that ``x @ W`` reads them in
order, with Q/K/V and gate/up fused into one matrix each (one matmul instead of three
or two: decode is memory-bandwidth bound).
"""

from __future__ import annotations

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


def load_stage(path: Path, layer_start: int, layer_end: int) -> StageWeights:
    reader = GGUFReader(path)
    config = read_config(reader)
    if not 0 <= layer_start < layer_end <= config.layers:
        raise ValueError(f"layer range [{layer_start}, {layer_end}) outside 0..{config.layers}")
    tensors = {t.name: t for t in reader.tensors}
    blocks = []
    for i in range(layer_start, layer_end):

        def t(name: str, i: int = i) -> Matrix:
            return _matrix(tensors[f"blk.{i}.{name}.weight"])

        blocks.append(
            Block(
                attn_norm=t("attn_norm").reshape(-1),
                wqkv=np.ascontiguousarray(
                    np.concatenate([t("attn_q"), t("attn_k"), t("attn_v")], axis=0).T
                ),
                wo=np.ascontiguousarray(t("attn_output").T),
                ffn_norm=t("ffn_norm").reshape(-1),
                w_gate_up=np.ascontiguousarray(
                    np.concatenate([t("ffn_gate"), t("ffn_up")], axis=0).T
                ),
                w_down=np.ascontiguousarray(t("ffn_down").T),
            )
        )
    last = layer_end == config.layers
    embedding = _matrix(tensors["token_embd.weight"]) if layer_start == 0 or last else None
    output_norm = _matrix(tensors["output_norm.weight"]).reshape(-1) if last else None
    return StageWeights(config, layer_start, layer_end, blocks, embedding, output_norm)
