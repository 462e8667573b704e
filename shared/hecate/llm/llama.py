"""The llama forward pass in numpy, for one contiguous range of blocks (and the
variations of it :mod:`hecate.llm.gguf_config` lists: Q/K norms, norms after attention
and feed-forward, GELU, a scaled embedding, sliding-window layers, capped logits).

Facts this relies on (checked against llama.cpp): RoPE rotates **adjacent pairs**
``(x[2i], x[2i+1])`` on ``llama`` (GGUF converters permute Q/K for that layout) and the
two halves ``(x[i], x[i+d/2])`` on ``qwen2``, each pair by ``position · inverse
frequency`` (:meth:`LlamaConfig.inverse_frequencies`); attention is grouped-query (each
KV head serves ``heads / kv_heads`` query heads); the output head is the token
embedding when the file has no ``output.weight`` (tied). Splitting the blocks over
stages gives bit-identical logits, since each block is applied the same way on the same
float32 values.

Decode is one token through 30 small blocks, so the cost of each numpy call counts as
much as the matmuls: the RoPE angles are computed once per forward (every block rotates
the same positions), Q and K are rotated together, the KV cache is preallocated and
grown by doubling instead of concatenated each step, and each KV head attends for its
whole group of query heads in one matmul (no repeated keys).

Decode is also memory-bandwidth bound: each weight is read whole for one row. So the
steps of several sessions run as one batch (``forward_batch``), their rows stacked
through each weight at once, and only attention is per session. One 30-block pass, one
BLAS thread, measured on the 2-core machine: 24 tokens/s for one session, 43 for a
batch of 4, 69 for 8, 101 for 16.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from hecate.llm.gguf_model import Block, LlamaConfig, StageWeights

Array = npt.NDArray[np.float32]


#: Below this many rows one matrix-vector product per row beats OpenBLAS's sgemm, which
#: has no kernel for a handful of rows (one 30-block pass, one thread: 2 rows 55 ms as
#: one product against 41 ms row by row, 3 rows 77 against 54; 4 rows 54 against 60).
GEMV_ROWS = 4


def matmul(x: npt.NDArray[Any], w: Array) -> Array:
    """``x @ w``, row by row for 2 or 3 rows (see :data:`GEMV_ROWS`); a row then gets
    the very same sums as when it runs alone."""
    if 1 < x.shape[0] < GEMV_ROWS:
        return np.stack([row @ w for row in x])
    out: Array = x @ w
    return out


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * weight


def gelu(x: Array) -> Array:
    """GELU by tanh's approximation, as llama.cpp's ``ggml_gelu``."""
    inner = np.float32(np.sqrt(2.0 / np.pi)) * (x + np.float32(0.044715) * x * x * x)
    return np.asarray(0.5 * x * (1.0 + np.tanh(inner)), dtype=np.float32)


def rope_tables(
    positions: npt.NDArray[np.int64], inv: npt.NDArray[np.float64]
) -> tuple[Array, Array]:
    """cos and sin of position · inv[i], shaped [T, 1, dim/2] to broadcast over heads."""
    angles = positions[:, None].astype(np.float64) * inv[None, :]
    return (
        np.cos(angles).astype(np.float32)[:, None, :],
        np.sin(angles).astype(np.float32)[:, None, :],
    )


def rope(x: Array, cos: Array, sin: Array, interleaved: bool = True) -> Array:
    """Rotate pairs of the last axis of ``x`` [T, heads, d]: adjacent ones, or the two
    halves' (``interleaved`` False)."""
    half = x.shape[-1] // 2
    pairs = (
        (slice(0, None, 2), slice(1, None, 2))
        if interleaved
        else (slice(0, half), slice(half, None))
    )
    even, odd = x[..., pairs[0]], x[..., pairs[1]]
    out = np.empty_like(x)
    out[..., pairs[0]] = even * cos - odd * sin
    out[..., pairs[1]] = even * sin + odd * cos
    return out


class KVCache:
    """Keys and values of one session, per block of this stage: [kv_heads, capacity, d]."""

    def __init__(self, blocks: int, kv_heads: int, head_dim: int, capacity: int = 64) -> None:
        self.k = np.zeros((blocks, kv_heads, capacity, head_dim), dtype=np.float32)
        self.v = np.zeros_like(self.k)
        self.length = 0

    def reserve(self, length: int, limit: int | None = None) -> None:
        """Make room for ``length`` positions (doubling, so appends cost amortised O(1)),
        never past ``limit`` (the model's context) unless ``length`` itself is: a cache
        near the context would otherwise double into memory it can never use."""
        capacity = self.k.shape[2]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        if limit is not None:
            capacity = max(length, min(capacity, limit))
        for name in ("k", "v"):
            old = getattr(self, name)
            new = np.zeros((*old.shape[:2], capacity, old.shape[3]), dtype=np.float32)
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


class LlamaStage:
    """Blocks ``[layer_start, layer_end)``; embeds on the first stage, heads on the last."""

    def __init__(self, weights: StageWeights) -> None:
        self.w = weights
        self.config: LlamaConfig = weights.config
        self.first = weights.layer_start == 0
        self.last = weights.layer_end == weights.config.layers

    @property
    def block_count(self) -> int:
        return len(self.w.blocks)

    def new_cache(self) -> KVCache:
        c = self.config
        return KVCache(len(self.w.blocks), c.kv_heads, c.head_dim)

    def free(self, cache: KVCache) -> None:
        """Nothing to give back: a cache is its own arrays, gone with its last reference."""
        del cache

    def copy_prefix(self, source: KVCache, cache: KVCache, length: int) -> None:
        """``cache`` (new) starts with ``source``'s first ``length`` positions."""
        cache.reserve(length, self.config.context)
        cache.k[:, :, :length] = source.k[:, :, :length]
        cache.v[:, :, :length] = source.v[:, :, :length]
        cache.length = length

    def logits_of(self, outs: list[Array]) -> Array:
        """The last-position logits [B, vocab] of what ``forward_batch`` returned."""
        return self.logits_batch(outs)

    def embed(self, tokens: list[int]) -> Array:
        assert self.w.embedding is not None, "only the first stage embeds"
        rows = self.w.embedding[np.asarray(tokens, dtype=np.int64)].astype(np.float32)
        if self.config.embed_scale != 1.0:
            rows *= np.float32(self.config.embed_scale)
        return rows

    def forward(self, hidden: Array, cache: KVCache) -> Array:
        """Run this stage's blocks on ``hidden`` [T, hidden] (the next T positions)."""
        return self.forward_batch([hidden], [cache])[0]

    def forward_batch(self, xs: list[Array], caches: list[KVCache]) -> list[Array]:
        """Run this stage's blocks for several sessions at once: ``xs[j]`` [T_j, hidden]
        are the next T_j positions of the session whose cache is ``caches[j]`` (each
        session once). Every row of every session goes through one matmul per weight
        (decode is memory-bandwidth bound: a weight read once serves the whole batch);
        RoPE rotates each row by its own position; attention is per session, over its
        own cache, with its own causal mask. Sessions with different row counts (decode
        steps and a prefill chunk) share a batch."""
        c = self.config
        sizes = [x.shape[0] for x in xs]
        starts = [cache.length for cache in caches]
        bounds = np.cumsum([0, *sizes])
        n = int(bounds[-1])
        for cache, start, t in zip(caches, starts, sizes, strict=True):
            cache.reserve(start + t, limit=c.context)
        heads, kv_heads, d = c.heads, c.kv_heads, c.head_dim
        group = heads // kv_heads
        qk_heads = heads + kv_heads
        q_dim = heads * d
        positions = np.concatenate(
            [np.arange(s, s + t, dtype=np.int64) for s, t in zip(starts, sizes, strict=True)]
        )
        tables = {False: rope_tables(positions, c.inverse_frequencies())}
        if c.window:
            tables[True] = rope_tables(positions, c.inverse_frequencies(sliding=True))
        scale = np.float32(c.scale)
        # A session's new queries over every cached and new key, for each query row of a
        # group ([group·T, S], rows ordered (group member, position)): causal, and on a
        # sliding layer also blind past the window. A single new position sees every
        # key (no mask) unless its layer slides past the window.
        masks: dict[bool, list[Array | None]] = {kind: [] for kind in tables}
        for start, t in zip(starts, sizes, strict=True):
            query = np.arange(start, start + t)[:, None]
            key = np.arange(start + t)[None, :]
            for sliding, kept in masks.items():
                blind = key > query
                if sliding:
                    blind |= query - key >= c.window
                if blind.any():
                    shut = np.where(blind, np.float32(-np.inf), np.float32(0.0))
                    kept.append(np.tile(shut, (group, 1)))
                else:
                    kept.append(None)
        x = xs[0] if len(xs) == 1 else np.concatenate(xs)
        attn = np.empty((n, q_dim), dtype=np.float32)
        for i, b in enumerate(self.w.blocks):
            sliding = c.slides(self.w.layer_start + i)
            cos, sin = tables[sliding]
            qkv = matmul(rms_norm(x, b.attn_norm, c.eps), b.wqkv)
            if b.bqkv is not None:
                qkv = qkv + b.bqkv
            qk = qkv[:, : qk_heads * d].reshape(n, qk_heads, d)
            if b.q_norm is not None and b.k_norm is not None:
                qk = np.concatenate(
                    [
                        rms_norm(qk[:, :heads], b.q_norm, c.eps),
                        rms_norm(qk[:, heads:], b.k_norm, c.eps),
                    ],
                    axis=1,
                )
            qk = rope(qk, cos, sin, c.rope_interleaved)
            v = qkv[:, qk_heads * d :].reshape(n, kv_heads, d)
            for j, cache in enumerate(caches):
                lo, hi, t = int(bounds[j]), int(bounds[j + 1]), sizes[j]
                start, end = starts[j], starts[j] + t
                cache.k[i, :, start:end] = qk[lo:hi, heads:].transpose(1, 0, 2)
                cache.v[i, :, start:end] = v[lo:hi].transpose(1, 0, 2)
                keys, values = cache.k[i, :, :end], cache.v[i, :, :end]  # [KV, S, d]
                # Query head h reads KV head h // group: [KV, group·T, d] against [KV, S, d].
                q = qk[lo:hi, :heads].reshape(t, kv_heads, group, d).transpose(1, 2, 0, 3)
                scores = (q.reshape(kv_heads, group * t, d) @ keys.transpose(0, 2, 1)) * scale
                mask = masks[sliding][j]
                if mask is not None:
                    scores += mask
                scores -= scores.max(axis=-1, keepdims=True)
                probs = np.exp(scores)
                probs /= probs.sum(axis=-1, keepdims=True)
                out = (probs @ values).reshape(kv_heads, group, t, d).transpose(2, 0, 1, 3)
                attn[lo:hi] = out.reshape(t, q_dim)
            o = matmul(attn, b.wo)
            if b.post_attn_norm is not None:
                o = rms_norm(o, b.post_attn_norm, c.eps)
            x = x + o
            h = rms_norm(x, b.ffn_norm, c.eps)
            f = self._experts(h, b) if b.router is not None else self._ffn(h, b.w_gate_up, b.w_down)
            if b.post_ffn_norm is not None:
                f = rms_norm(f, b.post_ffn_norm, c.eps)
            x = x + f
        for cache, start, t in zip(caches, starts, sizes, strict=True):
            cache.length = start + t
        if len(xs) == 1:
            return [x]
        return [x[int(bounds[j]) : int(bounds[j + 1])] for j in range(len(xs))]

    def _ffn(self, h: Array, gate_up: Array | None, down: Array | None) -> Array:
        assert gate_up is not None
        assert down is not None
        gate, up = np.split(matmul(h, gate_up), 2, axis=1)
        return matmul((gelu(gate) if self.config.gelu else gate / (1.0 + np.exp(-gate))) * up, down)

    def _experts(self, h: Array, b: Block) -> Array:
        """A mixture of experts, as llama.cpp's: the router's softmax over every expert,
        each row's top k, their weights renormalised to one (the sum kept above
        2^-14), each expert run on the rows that chose it, their outputs weighed."""
        assert b.router is not None
        assert b.experts_gate_up is not None
        assert b.experts_down is not None
        logits = matmul(h, b.router)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, : self.config.experts_used]
        weights = np.take_along_axis(probs, top, axis=1)
        weights /= np.maximum(weights.sum(axis=1, keepdims=True), np.float32(2**-14))
        out = np.zeros_like(h)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            y = self._ffn(h[rows], b.experts_gate_up[e], b.experts_down[e])
            out[rows] += y * weights[rows, slot][:, None]
        return out

    def logits(self, hidden: Array) -> Array:
        """The last position's logits (last stage only): final norm, output head."""
        return self.logits_batch([hidden])[0]

    def logits_batch(self, hiddens: list[Array]) -> Array:
        """Each session's last-position logits [B, vocab], in one head matmul (the head
        is the largest matrix of the model: read once for the batch)."""
        assert self.w.output_norm is not None
        assert self.w.head is not None
        last = np.concatenate([h[-1:] for h in hiddens])
        h = rms_norm(last, self.w.output_norm, self.config.eps)
        logits = matmul(h, self.w.head.T)
        cap = self.config.logit_softcap
        if cap:
            logits = np.float32(cap) * np.tanh(logits / np.float32(cap))
        return logits
