"""Reading a llama-family GGUF: hyper-parameters, and the tensors of a layer range.

Architectures ``llama`` (Llama 2 and 3, Mistral, SmolLM, TinyLlama) and ``qwen2``; they
differ in three facts the engine must honour, all read here into :class:`LlamaConfig`:
how RoPE pairs a head's dimensions (``llama``: adjacent pairs, the converters permute
Q and K for it; ``qwen2``: the two halves, NeoX's layout), whether Q, K and V carry a
bias (``qwen2``), and how positions are scaled (``rope_freqs``, Llama 3's per-frequency
factors, or a linear factor). Either may tie its output head to the embedding.

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
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf.quants import dequantize

from hecate.llm.gguf_file import BadGGUF, GGUFFile, Tensor

Matrix = npt.NDArray[np.float32]

#: architectures this engine runs, and whether RoPE rotates adjacent pairs in each
ARCHITECTURES = {"llama": True, "qwen2": False}


class UnsupportedModel(BadGGUF):
    """A GGUF whose architecture or position scaling the engine does not run."""


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
    arch: str = "llama"
    #: RoPE on adjacent pairs ``(x[2i], x[2i+1])``; else on halves ``(x[i], x[i+d/2])``
    rope_interleaved: bool = True
    #: positions are multiplied by this (a linear ``rope.scaling.factor`` f: 1/f)
    rope_scale: float = 1.0
    #: Llama 3's per-frequency divisors (the GGUF's ``rope_freqs``), else none
    rope_factors: tuple[float, ...] | None = None
    qkv_bias: bool = False
    tied_head: bool = True

    def inverse_frequencies(self) -> npt.NDArray[np.float64]:
        """RoPE's angle per position for each pair of a head, as llama.cpp computes it:
        ``scale · base^(-2i/d) / factor_i``."""
        d = self.head_dim
        inv = self.rope_base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        if self.rope_factors is not None:
            inv = inv / np.asarray(self.rope_factors, np.float64)
        out: npt.NDArray[np.float64] = inv * self.rope_scale
        return out


@dataclass
class Block:
    attn_norm: Matrix
    wqkv: Matrix  # [hidden, (heads + 2·kv_heads)·head_dim]
    wo: Matrix  # [hidden, hidden]
    ffn_norm: Matrix
    w_gate_up: Matrix  # [hidden, 2·ffn]
    w_down: Matrix  # [ffn, hidden]
    bqkv: Matrix | None = None  # [(heads + 2·kv_heads)·head_dim] (qwen2)


@dataclass
class StageWeights:
    config: LlamaConfig
    layer_start: int
    layer_end: int
    blocks: list[Block]
    embedding: Matrix | None  # [vocab, hidden]: first stage
    output_norm: Matrix | None  # last stage
    head: Matrix | None = None  # [vocab, hidden]: last stage (the embedding when tied)


#: bounds of what a header may say, beyond which it is damaged or crafted, each far past
#: any real model (Llama 3.1 405B: 126 blocks, 128 heads, an embedding of 16,384 and a
#: feed-forward of 53,248; vocabularies reach 256,000 tokens, contexts 10M positions)
LIMITS = {
    "block_count": 4096,
    "attention.head_count": 1 << 12,
    "attention.head_count_kv": 1 << 12,
    "attention.key_length": 1 << 12,
    "attention.value_length": 1 << 12,
    "embedding_length": 1 << 17,
    "feed_forward_length": 1 << 20,
    "context_length": 1 << 24,
    "vocab_size": 1 << 22,
}

#: a block's tensors, each ``(name, inputs, outputs)`` as words of :func:`check_shapes`'s
#: sizes (a norm has no outputs: a vector of its inputs)
BLOCK_TENSORS = (
    ("attn_norm", "hidden", None),
    ("attn_q", "hidden", "q"),
    ("attn_k", "hidden", "kv"),
    ("attn_v", "hidden", "kv"),
    ("attn_output", "q", "hidden"),
    ("ffn_norm", "hidden", None),
    ("ffn_gate", "hidden", "ffn"),
    ("ffn_up", "hidden", "ffn"),
    ("ffn_down", "ffn", "hidden"),
)
_BLOCK = re.compile(r"blk\.(\d+)\.")


def _whole(file: GGUFFile, key: str, value: Any, limit: int) -> int:
    """``value`` of metadata ``key`` as a count: a whole number from 1 to ``limit``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise BadGGUF(f"{file.path}: {key} {value!r} is not a whole number from 1 to {limit:,}")
    return value


def _positive(file: GGUFFile, key: str, value: Any) -> float:
    """``value`` of metadata ``key`` as a finite number above zero."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < math.inf:
        raise BadGGUF(f"{file.path}: {key} {value!r} is not a finite number above zero")
    return float(value)


def read_config(file: GGUFFile) -> LlamaConfig:
    """The hyper-parameters, each checked to be a number a model can have (counts whole
    and positive, within :data:`LIMITS`, heads sharing their KV heads evenly, and as many
    blocks as the file has ``blk.N`` tensors for), so that no later division, loop or
    allocation meets an impossible one. Tensors' shapes: :func:`check_shapes`."""
    arch = file.field("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise UnsupportedModel(
            f"{file.path}: architecture {arch!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    meta = file.metadata

    def count(key: str, default: int | None = None) -> int:
        full = f"{arch}.{key}"
        value = meta.get(full, default) if default is not None else file.field(full)
        return _whole(file, full, value, LIMITS[key])

    def number(key: str, default: float | None = None) -> float:
        full = f"{arch}.{key}"
        value = meta.get(full, default) if default is not None else file.field(full)
        return _positive(file, full, value)

    heads = count("attention.head_count")
    hidden = count("embedding_length")
    if f"{arch}.attention.key_length" not in meta and hidden % heads:
        raise BadGGUF(
            f"{file.path}: {arch}.embedding_length {hidden} is not a whole number of "
            f"{arch}.attention.head_count {heads} heads"
        )
    head_dim = count("attention.key_length", hidden // heads)
    if head_dim % 2:
        raise BadGGUF(f"{file.path}: heads of {head_dim} dimensions (RoPE rotates pairs)")
    if count("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModel(f"{file.path}: keys and values of different widths")
    kv_heads = count("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise BadGGUF(
            f"{file.path}: {heads} heads do not share {kv_heads} KV heads evenly "
            f"({arch}.attention.head_count_kv)"
        )
    scaling = str(meta.get(f"{arch}.rope.scaling.type", "none"))
    factor = number("rope.scaling.factor", 1.0)
    if scaling not in ("none", "linear") and factor != 1.0:
        raise UnsupportedModel(
            f"{file.path}: RoPE scaling {scaling!r} is not supported (supported: linear, "
            "and Llama 3's per-frequency factors)"
        )
    freqs = file.tensors.get("rope_freqs.weight")
    if freqs is not None and freqs.shape != (head_dim // 2,):
        raise BadGGUF(
            f"{file.path}: rope_freqs.weight is {list(freqs.shape)}, heads of {head_dim} "
            f"dimensions need [{head_dim // 2}]"
        )
    embd = file.tensors.get("token_embd.weight")
    if embd is None:
        raise BadGGUF(f"{file.path}: no token_embd.weight")
    if len(embd.shape) != 2:
        raise BadGGUF(f"{file.path}: token_embd.weight is {list(embd.shape)}, not a matrix")
    layers = count("block_count")
    blocks = {int(m.group(1)) for name in file.tensors if (m := _BLOCK.match(name))}
    if blocks != set(range(layers)):
        held = f"blocks {min(blocks)} to {max(blocks)}" if blocks else "no blocks"
        raise BadGGUF(
            f"{file.path}: {arch}.block_count {layers}, but its tensors are of {held} "
            f"({len(blocks)} in all)"
        )
    return LlamaConfig(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=count("feed_forward_length"),
        eps=number("attention.layer_norm_rms_epsilon"),
        rope_base=number("rope.freq_base", 10_000.0),
        vocab=count("vocab_size", embd.shape[1]),
        context=count("context_length"),
        arch=arch,
        rope_interleaved=ARCHITECTURES[arch],
        rope_scale=1.0 / factor if scaling == "linear" else 1.0,
        rope_factors=None if freqs is None else tuple(float(f) for f in _matrix(freqs)),
        qkv_bias="blk.0.attn_q.bias" in file.tensors,
        tied_head="output.weight" not in file.tensors,
    )


def check_shapes(file: GGUFFile, config: LlamaConfig) -> None:
    """Every tensor the model runs is in ``file`` with the shape ``config`` (its header)
    implies, else :class:`BadGGUF` naming the first that is not: the embedding (and the
    output head when not tied), the final norm, and each block's norms, attention (with
    qwen2's biases) and feed-forward. Run when a model is added: a header that disagrees
    with its weights would otherwise fail in a node, mid-graph."""
    c = config
    size = {
        "hidden": c.hidden,
        "q": c.heads * c.head_dim,
        "kv": c.kv_heads * c.head_dim,
        "ffn": c.ffn,
        "vocab": c.vocab,
    }
    why = (
        f"{c.arch}.embedding_length {c.hidden}, head_count {c.heads}, head_count_kv "
        f"{c.kv_heads}, heads of {c.head_dim}, feed_forward_length {c.ffn}, vocabulary "
        f"{c.vocab}"
    )

    def check(name: str, inputs: str, outputs: str | None) -> None:
        want = (size[inputs],) if outputs is None else (size[inputs], size[outputs])
        t = file.tensors.get(name)
        if t is None:
            raise BadGGUF(f"{file.path}: no {name} (a model of {c.layers} blocks needs it)")
        if t.shape != want:
            raise BadGGUF(
                f"{file.path}: {name} is {list(t.shape)}, the metadata implies {list(want)} ({why})"
            )

    check("token_embd.weight", "hidden", "vocab")
    if not c.tied_head:
        check("output.weight", "hidden", "vocab")
    check("output_norm.weight", "hidden", None)
    for i in range(c.layers):
        for name, inputs, outputs in BLOCK_TENSORS:
            check(f"blk.{i}.{name}.weight", inputs, outputs)
        if c.qkv_bias:
            for name, outputs in (("attn_q", "q"), ("attn_k", "kv"), ("attn_v", "kv")):
                check(f"blk.{i}.{name}.bias", outputs, None)


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

    blocks = []
    for i in range(layer_start, layer_end):
        b = f"blk.{i}"
        qkv = (f"{b}.attn_q", f"{b}.attn_k", f"{b}.attn_v")
        blocks.append(
            Block(
                attn_norm=prepared.get(f"{b}.attn_norm", flat(f"{b}.attn_norm")),
                wqkv=prepared.get(f"{b}.wqkv", stacked_t(*qkv)),
                wo=prepared.get(f"{b}.wo", stacked_t(f"{b}.attn_output")),
                ffn_norm=prepared.get(f"{b}.ffn_norm", flat(f"{b}.ffn_norm")),
                w_gate_up=prepared.get(f"{b}.w_gate_up", stacked_t(f"{b}.ffn_gate", f"{b}.ffn_up")),
                w_down=prepared.get(f"{b}.w_down", stacked_t(f"{b}.ffn_down")),
                bqkv=prepared.get(f"{b}.bqkv", biases(*qkv)) if config.qkv_bias else None,
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
