"""What a GGUF's header says its model is: the architecture and its hyper-parameters,
each checked to be a number a model can have, and every tensor's shape against them.

The architectures the engine runs differ from llama's block in a few facts, each read
here into :class:`LlamaConfig` from one table, :data:`ARCHITECTURES` (what llama.cpp's
graph of each does):

* how RoPE pairs a head's dimensions: adjacent pairs (``llama``: the converters permute
  Q and K for it), or the two halves (NeoX's layout: ``qwen2``, ``qwen3``, ``gemma3``);
* RMS norms on each head of Q and K before RoPE (``qwen3``, ``gemma3``);
* the attention's and the feed-forward's outputs normed again before each is added to
  the residual (``gemma3``'s ``post_attention_norm`` and ``post_ffw_norm``);
* the feed-forward's gate through GELU (tanh's approximation) instead of SiLU, and the
  embedding scaled by √hidden (``gemma3``);
* Q, K and V in one matrix (``attn_qkv``) and the gate and up in one (``ffn_up`` of
  twice the feed-forward's width, the gate first): ``phi3``;
* sliding-window attention (``gemma3``): most layers attend to the last
  ``attention.sliding_window`` positions only, with a RoPE base of their own
  (``rope.freq_base_swa``, 10,000 by default); every ``sliding_window_pattern``-th
  layer (6 by default) attends to everything;
* whether Q, K and V carry a bias (``qwen2``: read from the file), how positions are
  scaled (``rope_freqs``, Llama 3's per-frequency factors, or a linear factor), and
  whether the output head is the embedding (tied: no ``output.weight``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from gguf.quants import dequantize

from hecate.llm.gguf_file import BadGGUF, GGUFFile


@dataclass(frozen=True)
class Architecture:
    """How one architecture's blocks differ from llama's (the module doc's list)."""

    #: RoPE on adjacent pairs ``(x[2i], x[2i+1])``; else on halves ``(x[i], x[i+d/2])``
    rope_interleaved: bool = True
    qk_norm: bool = False
    post_norms: bool = False
    gelu: bool = False
    embed_scaled: bool = False
    sliding: bool = False
    fused: bool = False
    #: a mixture of experts in place of the feed-forward: never, where the file has
    #: ``expert_count`` (a Mixtral is a ``llama``), or always
    experts: Literal["never", "optional", "required"] = "never"


#: the architectures this engine runs, as llama.cpp runs them
ARCHITECTURES = {
    "llama": Architecture(experts="optional"),
    "qwen2": Architecture(rope_interleaved=False),
    "qwen3": Architecture(rope_interleaved=False, qk_norm=True),
    "gemma3": Architecture(
        rope_interleaved=False,
        qk_norm=True,
        post_norms=True,
        gelu=True,
        embed_scaled=True,
        sliding=True,
    ),
    # Its sliding window, written in some files, llama.cpp leaves off (each layer
    # attends to everything), as is done here.
    "phi3": Architecture(rope_interleaved=False, fused=True),
    "qwen3moe": Architecture(rope_interleaved=False, qk_norm=True, experts="required"),
}

#: llama.cpp's defaults for a sliding-window model that does not say: every sixth layer
#: attends to everything, the others by a base of their own
SLIDING_PATTERN = 6
SLIDING_ROPE_BASE = 10_000.0


_BLOCK = re.compile(r"blk\.(\d+)\.")


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
    #: each head of Q and K RMS-normed before RoPE (``attn_q_norm``, ``attn_k_norm``)
    qk_norm: bool = False
    #: the attention's and feed-forward's outputs normed before their residual adds
    post_norms: bool = False
    #: the feed-forward's gate through GELU (tanh's approximation), else SiLU
    gelu: bool = False
    #: the embedding's rows are multiplied by this (gemma3: √hidden)
    embed_scale: float = 1.0
    #: the attention's scale of Q·K (None: 1/√head_dim)
    attn_scale: float | None = None
    #: positions a sliding layer attends to (its own included); 0: no sliding layers
    window: int = 0
    #: for each layer, whether it slides (empty: none does)
    sliding_layers: tuple[bool, ...] = ()
    #: RoPE's base on sliding layers (unscaled, as llama.cpp's ``freq_base_swa``)
    rope_base_swa: float = SLIDING_ROPE_BASE
    #: logits through ``cap·tanh(logits/cap)`` when above zero
    logit_softcap: float = 0.0
    #: Q, K and V in one matrix (``attn_qkv``), the gate and up in one (``ffn_up``)
    fused: bool = False
    #: a mixture of experts in each block: how many, how many each position uses (its
    #: router's top k, their weights renormalised), and each one's feed-forward width
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0

    def slides(self, layer: int) -> bool:
        """Whether ``layer`` attends to the last :attr:`window` positions only."""
        return bool(self.sliding_layers) and self.sliding_layers[layer]

    @property
    def scale(self) -> float:
        """What Q·K is multiplied by before the softmax."""
        return 1.0 / math.sqrt(self.head_dim) if self.attn_scale is None else self.attn_scale

    def inverse_frequencies(self, sliding: bool = False) -> npt.NDArray[np.float64]:
        """RoPE's angle per position for each pair of a head, as llama.cpp computes it:
        ``scale · base^(-2i/d) / factor_i``; on a sliding layer its own base, unscaled."""
        d = self.head_dim
        base = self.rope_base_swa if sliding else self.rope_base
        inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        if self.rope_factors is not None:
            inv = inv / np.asarray(self.rope_factors, np.float64)
        out: npt.NDArray[np.float64] = inv if sliding else inv * self.rope_scale
        return out


#: bounds of what a header may say, beyond which it is damaged or crafted, each far past
#: any real model (Llama 3.1 405B: 126 blocks, 128 heads, an embedding of 16,384 and a
#: feed-forward of 53,248; vocabularies reach 262,144 tokens, contexts 10M positions)
LIMITS = {
    "block_count": 4096,
    "attention.head_count": 1 << 12,
    "attention.head_count_kv": 1 << 12,
    "attention.key_length": 1 << 12,
    "attention.value_length": 1 << 12,
    "attention.sliding_window": 1 << 24,
    "attention.sliding_window_pattern": 4096,
    "embedding_length": 1 << 17,
    "feed_forward_length": 1 << 20,
    "context_length": 1 << 24,
    "vocab_size": 1 << 22,
    "expert_count": 1 << 12,
    "expert_used_count": 1 << 12,
    "expert_feed_forward_length": 1 << 20,
}


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
    kind = ARCHITECTURES[arch]
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
    rotated = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rotated != head_dim:
        raise UnsupportedModel(
            f"{file.path}: RoPE on {rotated!r} of a head's {head_dim} dimensions "
            f"({arch}.rope.dimension_count; supported: the whole head)"
        )
    if "rope_factors_long.weight" in file.tensors:
        raise UnsupportedModel(
            f"{file.path}: long-context RoPE factors (rope_factors_long, Phi-3's 128k) "
            "are not supported"
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
    window, sliding = _sliding(file, arch, layers) if kind.sliding else (0, ())
    ffn = count("feed_forward_length")
    experts, used, expert_ffn = _experts(file, arch, kind, ffn)
    softcap = meta.get(f"{arch}.final_logit_softcapping", 0.0)
    return LlamaConfig(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=ffn,
        eps=number("attention.layer_norm_rms_epsilon"),
        rope_base=number("rope.freq_base", 10_000.0),
        vocab=count("vocab_size", embd.shape[1]),
        context=count("context_length"),
        arch=arch,
        rope_interleaved=kind.rope_interleaved,
        rope_scale=1.0 / factor if scaling == "linear" else 1.0,
        rope_factors=None
        if freqs is None
        else tuple(float(f) for f in dequantize(freqs.data, freqs.tensor_type).reshape(-1)),
        qkv_bias="blk.0.attn_q.bias" in file.tensors,
        tied_head="output.weight" not in file.tensors,
        qk_norm=kind.qk_norm,
        post_norms=kind.post_norms,
        gelu=kind.gelu,
        embed_scale=math.sqrt(hidden) if kind.embed_scaled else 1.0,
        attn_scale=_gemma_scale(layers, hidden, heads) if arch == "gemma3" else None,
        window=window,
        sliding_layers=sliding,
        rope_base_swa=number("rope.freq_base_swa", SLIDING_ROPE_BASE),
        logit_softcap=0.0 if not softcap else _positive(file, "softcapping", softcap),
        fused=kind.fused,
        experts=experts,
        experts_used=used,
        expert_ffn=expert_ffn,
    )


def _experts(file: GGUFFile, arch: str, kind: Architecture, ffn: int) -> tuple[int, int, int]:
    """How many experts, how many a position uses, and their width (by default the
    feed-forward's); none for a model without."""
    meta = file.metadata
    key = f"{arch}.expert_count"
    if not meta.get(key, 0):
        if kind.experts == "required":
            raise BadGGUF(f"{file.path}: no {key} (a {arch} is a mixture of experts)")
        return 0, 0, 0
    if kind.experts == "never":
        raise UnsupportedModel(f"{file.path}: a {arch} with experts is not supported")
    experts = _whole(file, key, meta[key], LIMITS["expert_count"])
    key = f"{arch}.expert_used_count"
    used = _whole(file, key, file.field(key), experts)
    key = f"{arch}.expert_feed_forward_length"
    width = _whole(file, key, meta.get(key, ffn), LIMITS["expert_feed_forward_length"])
    return experts, used, width


def _gemma_scale(layers: int, hidden: int, heads: int) -> float | None:
    """Gemma 3's scale of Q·K, as llama.cpp sets it: 1/√(hidden/heads) on the 27B (62
    blocks), else 1/√head_dim (None: the default; its ``query_pre_attn_scalar``)."""
    return 1.0 / math.sqrt(hidden // heads) if layers == 62 else None


def _sliding(file: GGUFFile, arch: str, layers: int) -> tuple[int, tuple[bool, ...]]:
    """The window and which layers slide (llama.cpp's ``set_swa_pattern``: with a
    pattern of n, layer i slides unless i % n is n - 1, and with 0 every layer does; a
    pattern may also be one flag a layer). No window, or a window of 0: none slides."""
    meta = file.metadata
    key = f"{arch}.attention.sliding_window"
    raw = meta.get(key, 0)
    if raw == 0:
        return 0, ()
    window = _whole(file, key, raw, LIMITS["attention.sliding_window"])
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = meta.get(key, SLIDING_PATTERN)
    if isinstance(pattern, list | tuple | np.ndarray):
        flags = tuple(bool(f) for f in pattern)
        if len(flags) != layers:
            raise BadGGUF(f"{file.path}: {key} has {len(flags)} flags for {layers} blocks")
        return window, flags
    if pattern == 0:  # as llama.cpp reads it: every layer slides
        return window, (True,) * layers
    n = _whole(file, key, pattern, LIMITS["attention.sliding_window_pattern"])
    return window, tuple(i % n < n - 1 for i in range(layers))
