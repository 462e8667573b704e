"""The llama forward pass in numpy, for one contiguous range of blocks.

Facts this relies on (checked against llama.cpp): RoPE rotates **adjacent pairs**
``(x[2i], x[2i+1])`` (GGUF converters permute Q/K for that layout); attention is
grouped-query (each KV head serves ``heads / kv_heads`` query heads); the output head
is the token embedding (tied). Splitting the blocks over stages gives bit-identical
logits, since each block is applied the same way on the same float32 values.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hecate.llm.gguf_model import LlamaConfig, StageWeights

Array = npt.NDArray[np.float32]


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return (x * scale * weight).astype(np.float32)


def rope(x: Array, positions: npt.NDArray[np.int64], base: float) -> Array:
    """Rotate adjacent pairs of the last axis by position · base^(-2i/d)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = positions[:, None].astype(np.float64) * inv[None, :]  # [T, d/2]
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


class KVCache:
    """Keys and values of one session, per block of this stage, grown as tokens arrive."""

    def __init__(self, blocks: int) -> None:
        self.k: list[Array | None] = [None] * blocks
        self.v: list[Array | None] = [None] * blocks
        self.length = 0

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.k, *self.v) if a is not None)


class LlamaStage:
    """Blocks ``[layer_start, layer_end)``; embeds on the first stage, heads on the last."""

    def __init__(self, weights: StageWeights) -> None:
        self.w = weights
        self.config: LlamaConfig = weights.config
        self.first = weights.layer_start == 0
        self.last = weights.layer_end == weights.config.layers

    def new_cache(self) -> KVCache:
        return KVCache(len(self.w.blocks))

    def embed(self, tokens: list[int]) -> Array:
        assert self.w.embedding is not None, "only the first stage embeds"
        return self.w.embedding[np.asarray(tokens, dtype=np.int64)].astype(np.float32)

    def forward(self, hidden: Array, cache: KVCache) -> Array:
        """Run this stage's blocks on ``hidden`` [T, hidden] (the next T positions)."""
        c = self.config
        t = hidden.shape[0]
        start = cache.length
        positions = np.arange(start, start + t, dtype=np.int64)
        q_dim, kv_dim = c.heads * c.head_dim, c.kv_heads * c.head_dim
        group = c.heads // c.kv_heads
        scale = np.float32(1.0 / np.sqrt(c.head_dim))
        # Causal mask of the new queries over every cached and new key.
        mask = np.triu(np.full((t, start + t), -np.inf, dtype=np.float32), k=start + 1)
        x = hidden
        for i, b in enumerate(self.w.blocks):
            a = rms_norm(x, b.attn_norm, c.eps)
            qkv = a @ b.wqkv
            q = rope(qkv[:, :q_dim].reshape(t, c.heads, c.head_dim), positions, c.rope_base)
            k = rope(
                qkv[:, q_dim : q_dim + kv_dim].reshape(t, c.kv_heads, c.head_dim),
                positions,
                c.rope_base,
            )
            v = qkv[:, q_dim + kv_dim :].reshape(t, c.kv_heads, c.head_dim)
            prev_k, prev_v = cache.k[i], cache.v[i]
            keys = k if prev_k is None else np.concatenate([prev_k, k], axis=0)
            values = v if prev_v is None else np.concatenate([prev_v, v], axis=0)
            cache.k[i], cache.v[i] = keys, values
            # [heads, T, S] scores: query head h reads KV head h // group.
            qh = q.transpose(1, 0, 2)  # [H, T, d]
            kh = np.repeat(keys.transpose(1, 0, 2), group, axis=0)  # [H, S, d]
            vh = np.repeat(values.transpose(1, 0, 2), group, axis=0)
            scores = (qh @ kh.transpose(0, 2, 1)) * scale + mask
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = (probs @ vh).transpose(1, 0, 2).reshape(t, q_dim)
            x = (x + attn @ b.wo).astype(np.float32)
            m = rms_norm(x, b.ffn_norm, c.eps)
            gu = m @ b.w_gate_up
            gate, up = gu[:, : c.ffn], gu[:, c.ffn :]
            x = (x + ((gate / (1.0 + np.exp(-gate))) * up) @ b.w_down).astype(np.float32)
        cache.length += t
        return x

    def logits(self, hidden: Array) -> Array:
        """The last position's logits (last stage only): final norm, tied head."""
        assert self.w.output_norm is not None
        assert self.w.embedding is not None
        h = rms_norm(hidden[-1:], self.w.output_norm, self.config.eps)
        return (h @ self.w.embedding.T)[0]
