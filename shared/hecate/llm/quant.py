"""GGUF weight blocks as ONNX Runtime's ``MatMulNBits`` takes them, exactly.

``MatMulNBits`` (``com.microsoft``) multiplies by a matrix of ``N`` rows of ``K`` packed
integers, in blocks of ``block`` along ``K``, each block with a float scale and an
integer zero point (``w = scale · (q - zero)``; the default zero point is the middle of
the range: 8 for 4 bits, 128 for 8). Four bits go two to a byte, the even element in the
low nibble. The GGUF's own blocks map onto it without re-quantising (which changed the
greedy text within a few tokens):

- ``Q4_0``: ``w = d · (q - 8)``, ``q`` 0..15: 4 bits, the default zero point.
- ``Q8_0``: ``w = d · q``, ``q`` -128..127: 8 bits, stored ``q + 128``.
- ``Q4_1``: ``w = d · q + m``, ``q`` 0..15, which is ``d · (q - 8) + (m + 8d)``: 4 bits at
  the default zero point, plus an offset per block, ``x · offset`` summed block by block
  (``blocksum(x) @ offset``, a ``[K/32, N]`` product: tiny).

A GGUF row is one output (``N``) of ``K`` inputs, already in the order ``MatMulNBits``
wants; only the nibbles move (GGUF keeps elements ``j`` and ``j + 16`` of a block in one
byte, ``MatMulNBits`` elements ``2i`` and ``2i + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]

BLOCK = 32


class UnsupportedWeights(ValueError):
    """A tensor whose type the engine has no exact kernel for; names type and tensor."""


@dataclass(frozen=True)
class Packed:
    """One weight matrix as ``MatMulNBits`` inputs (or plain float32, ``bits`` 0)."""

    n: int  # outputs
    k: int  # inputs
    bits: int  # 4 or 8; 0: ``dense`` holds the float32 matrix as [K, N]
    block: int
    data: U8  # [N, K/block, block·bits/8]
    scales: F32  # [N · K/block]
    offset: F32 | None = None  # [K/block, N]: added as blocksum(x) @ offset (Q4_1)
    dense: F32 | None = None

    def nbytes(self) -> int:
        extra = 0 if self.offset is None else self.offset.nbytes
        if self.dense is not None:
            return int(self.dense.nbytes)
        return int(self.data.nbytes + self.scales.nbytes + extra)


def _blocks(raw: U8, n: int, block_bytes: int) -> U8:
    return np.ascontiguousarray(raw).reshape(n, -1, block_bytes)


def _scale(blocks: U8, at: int) -> F32:
    """The float16 at byte ``at`` of every block, as float32 [N, blocks]."""
    half = np.ascontiguousarray(blocks[:, :, at : at + 2]).view(np.float16)[..., 0]
    return half.astype(np.float32)


def _nibbles(qs: U8) -> U8:
    """GGUF's 16 bytes of a 4-bit block (elements j and j+16 in byte j) repacked as
    MatMulNBits wants them (elements 2i and 2i+1 in byte i, the even one low)."""
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # the 32 values in order
    packed: U8 = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    return packed


def pack(
    name: str, kind: GGMLQuantizationType, raw: npt.NDArray[np.generic], n: int, k: int
) -> Packed:
    """``raw`` is the tensor's data as the GGUF reader gives it (rows of blocks, or
    floats); ``n`` outputs of ``k`` inputs each."""
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        dense = np.ascontiguousarray(np.asarray(raw, dtype=np.float32).reshape(n, k).T)
        return Packed(
            n, k, 0, BLOCK, np.zeros((0,), np.uint8), np.zeros((0,), np.float32), None, dense
        )
    if k % BLOCK:
        raise UnsupportedWeights(f"{name}: {k} inputs are not whole blocks of {BLOCK}")
    raw8 = np.asarray(raw).view(np.uint8)
    if kind == GGMLQuantizationType.Q8_0:
        b = _blocks(raw8, n, 2 + BLOCK)
        q = (b[:, :, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return Packed(n, k, 8, BLOCK, np.ascontiguousarray(q), _scale(b, 0).reshape(-1))
    if kind == GGMLQuantizationType.Q4_0:
        b = _blocks(raw8, n, 2 + BLOCK // 2)
        return Packed(n, k, 4, BLOCK, _nibbles(b[:, :, 2:]), _scale(b, 0).reshape(-1))
    if kind == GGMLQuantizationType.Q4_1:
        b = _blocks(raw8, n, 4 + BLOCK // 2)
        d, m = _scale(b, 0), _scale(b, 2)
        offset = np.ascontiguousarray((m + 8.0 * d).T, dtype=np.float32)  # [K/32, N]
        return Packed(n, k, 4, BLOCK, _nibbles(b[:, :, 4:]), d.reshape(-1), offset)
    raise UnsupportedWeights(f"{name}: weight type {kind.name} is not supported")


def unpack(p: Packed) -> F32:
    """The float32 matrix [K, N] ``p`` stands for (what tests hold the kernel against)."""
    if p.dense is not None:
        return p.dense
    blocks = p.k // p.block
    if p.bits == 8:
        q = p.data.astype(np.float32) - 128.0
    else:
        low, high = p.data & 0x0F, p.data >> 4
        q = np.stack([low, high], axis=-1).reshape(p.n, blocks, p.block).astype(np.float32) - 8.0
    w = q * p.scales.reshape(p.n, blocks, 1)
    if p.offset is not None:
        w = w + p.offset.T.reshape(p.n, blocks, 1)
    return np.ascontiguousarray(w.reshape(p.n, p.k).T, dtype=np.float32)
