"""Small llama-family GGUFs (llama, qwen2, qwen3, gemma3, phi3; mixtures of experts as
Mixtral's llama and qwen3moe) of random weights, one weight type throughout, for holding
the engine against the numpy model on every type and shape it claims.

The blocks are random bytes with float16 scales drawn, then every scale of the file
rescaled so that each weight matrix has a standard deviation of about
:data:`WEIGHT_STD` (random blocks at face value would blow the activations up within a
layer). Both models read the very same blocks, so the comparison is exact in its
inputs: whatever differs comes from how each runs them.

``python -m hecate_dev.synthetic_gguf OUT.gguf --type Q4_K`` writes one.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, RopeScalingType
from gguf.quants import dequantize, quantize

from hecate.llm.gguf_file import GGUFFile

WEIGHT_STD = 0.05
#: gemma3's norms after attention and after the FFN are drawn near this, not one. gemma3
#: scales the embedding by sqrt(hidden), and beside it blocks whose outputs are normed to
#: about one leave the tied head reading the last token's own embedding: it repeats that
#: token at every step, whatever the attention, its window or its RoPE did
GEMMA_POST_NORM = 4.0
#: the architectures :func:`write` makes, by their GGUF names
ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen3moe")
#: those whose blocks may hold experts (``Shape.experts``); qwen3moe's always do
MOE_ARCHS = ("llama", "qwen3moe")
#: qwen2's Q, K and V biases: large beside a projection's output (std about 0.8), so a
#: bias left out changes the answer
BIAS_STD = 0.5

#: weights and bytes of one block, and where its float16 scales sit in it
LAYOUT: dict[Q, tuple[int, int, tuple[int, ...]]] = {
    Q.Q4_0: (32, 18, (0,)),
    Q.Q4_1: (32, 20, (0, 2)),
    Q.Q8_0: (32, 34, (0,)),
    Q.Q5_0: (32, 22, (0,)),
    Q.Q5_1: (32, 24, (0, 2)),
    Q.IQ4_NL: (32, 18, (0,)),
    Q.IQ4_XS: (256, 136, (0,)),
    Q.Q3_K: (256, 110, (108,)),
    Q.Q2_K: (256, 84, (80, 82)),
    Q.Q4_K: (256, 144, (0, 2)),
    Q.Q5_K: (256, 176, (0, 2)),
    Q.Q6_K: (256, 210, (208,)),
}


@dataclass(frozen=True)
class Shape:
    layers: int = 3
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 512
    vocab: int = 512
    context: int = 512
    #: RoPE's base (gemma3: of its global layers)
    rope_base: float = 10_000.0
    #: ``llama``; ``qwen2`` (biases on Q, K and V; RoPE on halves); ``qwen3`` (an RMS norm
    #: on each head of Q and of K before RoPE, ``attn_q_norm``/``attn_k_norm``; RoPE on
    #: halves); ``gemma3`` (Q/K norms as qwen3, norms after attention and after the FFN,
    #: GELU, the embedding scaled by sqrt(hidden), sliding-window layers); ``phi3`` (Q, K
    #: and V in one ``attn_qkv``, rows in that order; the FFN's gate and up in one
    #: ``ffn_up`` of twice the width, the gate's rows first; RoPE on halves); ``qwen3moe``
    #: (qwen3's attention, every block's FFN a mixture of experts)
    arch: str = "llama"
    #: the output head is the embedding (else an ``output.weight`` of its own)
    tied: bool = True
    #: ``none``; ``llama3``: per-frequency factors (``rope_freqs``); ``linear``: factor 4
    rope_scaling: str = "none"
    #: the width of a head, written as ``key_length`` and ``value_length``; None:
    #: ``hidden // heads``, and neither key written
    head_dim: int | None = None
    #: the RMS norms' epsilon (``layer_norm_rms_epsilon``)
    rms_eps: float = 1e-5
    #: gemma3: the sliding layers' window (``attention.sliding_window``: a token sees
    #: itself and the ``window - 1`` before it); 0: not written, every layer global
    window: int = 0
    #: gemma3: ``attention.sliding_window_pattern``, every ``window_pattern``-th layer
    #: global and the others sliding (llama.cpp: layer i slides when
    #: ``i % window_pattern < window_pattern - 1``; 0: every layer; 1, with a window:
    #: llama.cpp aborts, no layer sliding); None: not written, as in Gemma 3's own files,
    #: and llama.cpp takes 6
    window_pattern: int | None = None
    #: gemma3: RoPE's base on the sliding layers (``rope.freq_base_swa``); None: not
    #: written, and llama.cpp takes 10,000
    rope_base_swa: float | None = None
    #: a mixture of experts in every block (``llama``: Mixtral's layout; ``qwen3moe``):
    #: ``expert_count`` FFNs, stored as 3-D ``ffn_{gate,up,down}_exps`` beside a router
    #: ``ffn_gate_inp``, each token taking the weighted sum of ``experts_used``
    #: (``expert_used_count``) of them; 0: one dense FFN
    experts: int = 0
    experts_used: int = 0
    #: qwen3moe: each expert's width (``expert_feed_forward_length``; ``ffn`` is then
    #: written as ``feed_forward_length`` only, the dense width that Qwen3-MoE's files
    #: carry and its blocks do not use); None: ``ffn``
    expert_ffn: int | None = None
    #: the final norm's weights (``output_norm``) are drawn near this, not one: every
    #: logit scales with it, and so does the margin between the two best
    final_norm: float = 1.0

    @property
    def head_width(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def expert_width(self) -> int:
        return self.expert_ffn if self.expert_ffn is not None else self.ffn


#: Llama 3.1's RoPE scaling (its config.json), at this file's scale of contexts
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original": 256}
LINEAR_FACTOR = 4.0


def llama3_factors(head_dim: int, base: float) -> npt.NDArray[np.float32]:
    """The divisor of each RoPE frequency, as llama.cpp's converter writes ``rope_freqs``
    from a Llama 3 config: 1 for short wavelengths, ``factor`` for long ones, smoothed
    between."""
    factor, low, high = LLAMA3["factor"], LLAMA3["low_freq_factor"], LLAMA3["high_freq_factor"]
    original = LLAMA3["original"]
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv
    smooth = (original / wavelen - low) / (high - low)
    between = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(
        wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, between)
    )
    return out.astype(np.float32)


def random_blocks(kind: Q, n: int, k: int, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """``n`` rows of ``k`` weights as ``kind`` blocks: random bytes, finite scales."""
    weights, size, scales = LAYOUT[kind]
    raw = rng.integers(0, 256, size=(n, k // weights, size), dtype=np.uint8)
    for at in scales:
        # Either sign, as a file holds: Q4_0's d is the block's extreme over -8.
        half = rng.normal(0, 0.05, size=(n, k // weights)).astype(np.float16)
        raw[:, :, at : at + 2] = half.view(np.uint8).reshape(n, k // weights, 2)
    return raw.reshape(n, -1)


#: weights in a matrix past which its std is estimated from its first SAMPLE_ROWS rows
SAMPLED_ABOVE = 1 << 22
SAMPLE_ROWS = 64


def _scaled(kind: Q, raw: npt.NDArray[np.uint8], n: int, k: int) -> npt.NDArray[np.uint8]:
    """``raw`` with every float16 scale multiplied so the matrix's std is WEIGHT_STD.
    A large matrix's std is taken from its first rows (random blocks: the same
    statistics throughout), which makes an 8B-shaped file in about a minute and a half
    instead of dequantising every matrix whole."""
    sample = raw if n * k <= SAMPLED_ABOVE else raw[:SAMPLE_ROWS]
    std = float(np.std(dequantize(sample, kind)))
    factor = WEIGHT_STD / std if std > 0 else 1.0
    weights, size, scales = LAYOUT[kind]
    out = raw.reshape(n, k // weights, size).copy()
    for at in scales:
        half = out[:, :, at : at + 2].copy().view(np.float16).astype(np.float32) * factor
        out[:, :, at : at + 2] = half.astype(np.float16).view(np.uint8)
    return out.reshape(n, -1)


def matrix(
    kind: Q, n: int, k: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.generic], Q | None]:
    """A weight of ``n`` outputs by ``k`` inputs as the writer takes it, and its raw type
    (None: a plain float array the writer types itself)."""
    if kind == Q.F32:
        return rng.normal(0, WEIGHT_STD, size=(n, k)).astype(np.float32), None
    if kind == Q.F16:
        return rng.normal(0, WEIGHT_STD, size=(n, k)).astype(np.float16), None
    if kind == Q.BF16:
        return quantize(rng.normal(0, WEIGHT_STD, size=(n, k)).astype(np.float32), kind), kind
    return _scaled(kind, random_blocks(kind, n, k, rng), n, k), kind


#: what :func:`write` can quantise drawn weights to itself (gguf's quantisers, which give
#: llama.cpp's bytes for these types; the golden files check that they still do)
QUANTISABLE = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)


def drawn(
    kind: Q, n: int, k: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.generic], Q | None]:
    """A weight drawn as floats, stored as ``kind`` as llama.cpp's quantiser would."""
    floats = rng.normal(0, WEIGHT_STD, size=(n, k)).astype(np.float32)
    if kind == Q.F32:
        return floats, None
    if kind == Q.F16:
        return floats.astype(np.float16), None
    if kind not in QUANTISABLE:
        raise ValueError(f"{kind.name}: made from floats only by llama.cpp's quantiser")
    return quantize(floats, kind), kind


def write(
    path: Path,
    kind: Q,
    shape: Shape = Shape(),
    seed: int = 0,
    *,
    floats: bool = False,
    tokenizer: Path | Mapping[str, Any] | None = None,
) -> Path:
    """A model of ``shape`` with every weight matrix of type ``kind`` (but the experts'
    routers, float32 as llama.cpp's quantiser leaves them): random blocks at face value
    (the embedding Q8_0, norms one), or with ``floats`` drawn as float32 and quantised
    (:data:`QUANTISABLE`) with the embedding too, norms drawn near one: what llama.cpp's
    ``--pure`` quantiser makes of the float32 file of the same seed.
    ``tokenizer``: a GGUF whose tokenizer (vocabulary, merges, special ids) the model
    takes, or those keys themselves, and its vocabulary's size; else none
    (``no_vocab``)."""
    rng = np.random.default_rng(seed)
    s = shape
    source = GGUFFile(tokenizer).metadata if isinstance(tokenizer, Path) else tokenizer
    if source is not None:
        s = replace(s, vocab=len(source["tokenizer.ggml.tokens"]))
    _check(s)
    gemma = s.arch == "gemma3"
    d = s.head_width
    w = GGUFWriter(str(path), s.arch)
    w.add_block_count(s.layers)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    if s.head_dim is not None:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_rope_freq_base(s.rope_base)
    if s.arch == "phi3":  # as Phi-3's converter writes it; llama.cpp takes the head's width
        w.add_rope_dimension_count(d)
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
    if s.arch == "qwen3moe":
        w.add_expert_feed_forward_length(s.expert_width)
    # llama.cpp requires none of these (all read as optional), but checks their types:
    # uint32 for the window and pattern, float32 for the base.
    if s.window:
        w.add_sliding_window(s.window)
    if s.window_pattern is not None:
        w.add_sliding_window_pattern(s.window_pattern)
    if s.rope_base_swa is not None:
        w.add_rope_freq_base_swa(s.rope_base_swa)
    w.add_context_length(s.context)
    w.add_vocab_size(s.vocab)
    if source is None:  # the tests feed token ids (llama.cpp loads such a file as is)
        w.add_tokenizer_model("no_vocab")
    else:
        _copy_tokenizer(w, source)
    if s.rope_scaling == "linear":
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(LINEAR_FACTOR)
    elif s.rope_scaling == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(d, s.rope_base))
    elif s.rope_scaling != "none":
        raise ValueError(f"rope scaling {s.rope_scaling!r}: none, linear or llama3")

    draw = drawn if floats else matrix

    def put(name: str, data: npt.NDArray[np.generic], raw_dtype: Q | None) -> None:
        if raw_dtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=raw_dtype)  # shape: from its bytes

    def tensor(name: str, n: int, k: int, as_kind: Q = kind) -> None:
        put(name, *draw(as_kind, n, k, rng))

    def fused(name: str, outputs: tuple[int, ...], k: int) -> None:
        # Each part drawn (and scaled) as the separate matrix it stands for, in the
        # separate matrices' order, then its rows stacked: a row's blocks are its own.
        parts = [draw(kind, n, k, rng) for n in outputs]
        put(name, np.concatenate([data for data, _ in parts]), parts[0][1])

    def experts(name: str, n: int, k: int) -> None:
        # [experts, n, k] (GGUF: [k, n, experts]), each expert drawn as a matrix of its
        # own: the quantisers work along the last axis, a row at a time, as llama.cpp's.
        parts = [draw(kind, n, k, rng) for _ in range(s.experts)]
        put(name, np.stack([data for data, _ in parts]), parts[0][1])

    def norm(name: str, size: int = s.hidden, scale: float = 1.0) -> None:
        # Gemma's files hold 1 + the checkpoint's weight (its converter adds the one), so
        # the same draw near one serves every arch.
        weight = np.ones(size, np.float32)
        if floats:
            weight += rng.normal(0, 0.1, size=size).astype(np.float32)
        if scale != 1.0:
            weight *= np.float32(scale)
        w.add_tensor(name, weight)

    # The embedding (and tied head) is Q8_0 for the quantised types, as in SmolLM2's file.
    plain = kind in (Q.F32, Q.F16) or floats
    tensor("token_embd.weight", s.vocab, s.hidden, kind if plain else Q.Q8_0)
    if not s.tied:
        tensor("output.weight", s.vocab, s.hidden)
    norm("output_norm.weight", scale=s.final_norm)
    for i in range(s.layers):
        b = f"blk.{i}"
        norm(f"{b}.attn_norm.weight")
        norm(f"{b}.ffn_norm.weight")
        if s.arch == "phi3":
            fused(f"{b}.attn_qkv.weight", (s.heads * d, s.kv_heads * d, s.kv_heads * d), s.hidden)
        else:
            tensor(f"{b}.attn_q.weight", s.heads * d, s.hidden)
            tensor(f"{b}.attn_k.weight", s.kv_heads * d, s.hidden)
            tensor(f"{b}.attn_v.weight", s.kv_heads * d, s.hidden)
        if s.arch == "qwen2":
            for name, n in (("q", s.heads), ("k", s.kv_heads), ("v", s.kv_heads)):
                bias = rng.normal(0, BIAS_STD, size=n * d).astype(np.float32)
                w.add_tensor(f"{b}.attn_{name}.bias", bias)
        if s.arch in ("qwen3", "gemma3", "qwen3moe"):
            norm(f"{b}.attn_q_norm.weight", d)
            norm(f"{b}.attn_k_norm.weight", d)
        tensor(f"{b}.attn_output.weight", s.hidden, s.heads * d)
        if s.experts:
            # The router stays float32 whatever the type: llama.cpp's quantiser leaves
            # every ffn_gate_inp as it is. Its weights are drawn as any matrix's, which
            # makes the experts' logits vary by about 0.8 from token to token.
            tensor(f"{b}.ffn_gate_inp.weight", s.experts, s.hidden, Q.F32)
            experts(f"{b}.ffn_gate_exps.weight", s.expert_width, s.hidden)
            experts(f"{b}.ffn_up_exps.weight", s.expert_width, s.hidden)
            experts(f"{b}.ffn_down_exps.weight", s.hidden, s.expert_width)
        elif s.arch == "phi3":
            fused(f"{b}.ffn_up.weight", (s.ffn, s.ffn), s.hidden)
            tensor(f"{b}.ffn_down.weight", s.hidden, s.ffn)
        else:
            tensor(f"{b}.ffn_gate.weight", s.ffn, s.hidden)
            tensor(f"{b}.ffn_up.weight", s.ffn, s.hidden)
            tensor(f"{b}.ffn_down.weight", s.hidden, s.ffn)
        if gemma:
            norm(f"{b}.post_attention_norm.weight", scale=GEMMA_POST_NORM)
            norm(f"{b}.post_ffw_norm.weight", scale=GEMMA_POST_NORM)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _check(s: Shape) -> None:
    """Refuses a shape that :func:`write` cannot make as llama.cpp reads it."""
    if s.arch not in ARCHS:
        raise ValueError(f"arch {s.arch!r}: one of {', '.join(ARCHS)}")
    if s.arch != "gemma3" and (
        s.window or s.window_pattern is not None or s.rope_base_swa is not None
    ):
        raise ValueError(f"{s.arch}: sliding windows are gemma3's")
    if s.arch == "phi3" and s.head_width * s.heads != s.hidden:
        # llama.cpp's phi3 takes Q and the attention's output as wide as the model
        raise ValueError(f"phi3: heads of {s.head_width} times {s.heads} must be {s.hidden}")
    if s.experts and s.arch not in MOE_ARCHS:
        raise ValueError(f"{s.arch}: experts are {' and '.join(MOE_ARCHS)}'s")
    if s.arch == "qwen3moe" and not s.experts:
        raise ValueError("qwen3moe: every block holds experts (experts > 0)")
    if s.experts and not 0 < s.experts_used <= s.experts:
        raise ValueError(f"experts_used {s.experts_used}: 1 to {s.experts}")
    if not s.experts and s.experts_used:
        raise ValueError("experts_used without experts")
    if s.expert_ffn is not None and s.arch != "qwen3moe":
        # llama's experts are ``feed_forward_length`` wide, whatever else is written
        raise ValueError(f"{s.arch}: an expert width apart from ffn is qwen3moe's")


def _copy_tokenizer(w: GGUFWriter, meta: Mapping[str, Any]) -> None:
    w.add_tokenizer_model(str(meta["tokenizer.ggml.model"]))
    if "tokenizer.ggml.pre" in meta:
        w.add_tokenizer_pre(str(meta["tokenizer.ggml.pre"]))
    w.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    if "tokenizer.ggml.scores" in meta:
        w.add_token_scores([float(x) for x in meta["tokenizer.ggml.scores"]])
    w.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    if "tokenizer.ggml.merges" in meta:
        w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    for key, add in (
        ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
        ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
        ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id),
    ):
        if key in meta:
            add(int(meta[key]))
    w.add_add_bos_token(bool(meta.get("tokenizer.ggml.add_bos_token", False)))
    if "tokenizer.ggml.add_space_prefix" in meta:
        w.add_add_space_prefix(bool(meta["tokenizer.ggml.add_space_prefix"]))


#: the text :func:`spm_vocabulary` learns its pieces from
SPM_CORPUS = (
    "The capital of France is Paris. Once upon a time, in a small village, there lived "
    "an old man who told stories to the children of the village every evening. "
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2) "
    "In 1969, 12 people walked on the Moon; the last of them left it in 1972."
)


def spm_vocabulary(size: int = 400) -> dict[str, Any]:
    """A SentencePiece (llama) vocabulary learnt crudely from :data:`SPM_CORPUS`: the
    control tokens, the 256 byte tokens, every character of the corpus, then its most
    frequent pieces of 2 to 6 characters (spaces as U+2581), each scored by how often it
    occurs: the layout of Llama 2's and TinyLlama's files, small enough for a test."""
    text = "\u2581" + SPM_CORPUS.replace(" ", "\u2581")
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3, *([6] * 256)]
    scores = [0.0] * len(tokens)
    chars = sorted(set(text))
    counts: dict[str, int] = {}
    for n in range(2, 7):
        for i in range(len(text) - n + 1):
            piece = text[i : i + n]
            counts[piece] = counts.get(piece, 0) + 1
    pieces = sorted((p for p, c in counts.items() if c > 1), key=lambda p: (-counts[p], p))
    for piece in [*chars, *pieces][: size - len(tokens)]:
        tokens.append(piece)
        types.append(1)
        scores.append(-float(len(tokens)) if len(piece) > 1 else -1e4 - len(tokens))
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": True,
    }


def tensors_sha256(path: Path) -> str:
    """A hash of every tensor's name, type and bytes, in name order: equal for two files
    of the same weights whatever their metadata."""
    digest = hashlib.sha256()
    for name, t in sorted(GGUFFile(path).tensors.items()):
        digest.update(f"{name}:{t.tensor_type.name}:".encode())
        digest.update(np.ascontiguousarray(t.data).tobytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", default="Q4_K", choices=["F32", "F16", *(q.name for q in LAYOUT)])
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write(args.out, Q[args.type], Shape(kv_heads=args.kv_heads), args.seed))


if __name__ == "__main__":
    main()
