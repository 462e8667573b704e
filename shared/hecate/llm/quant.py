"""GGUF weight blocks as ONNX Runtime's ``MatMulNBits`` takes them, exactly (the
weights a :class:`Packed` stands for are the file's; :mod:`hecate.llm.onnx_graph` says
where a product rounds beyond the int8 activations).

``MatMulNBits`` (``com.microsoft``) multiplies by a matrix of ``N`` rows of ``K`` packed
integers, in blocks of ``block`` along ``K``, each block with a float scale and an
integer zero point (``w = scale · (q - zero)``; the default zero point is the middle of
the range: 8 for 4 bits, 128 for 8). Four bits go two to a byte, the even element in the
low nibble. The GGUF's own blocks map onto it without re-quantising (which changed the
greedy text within a few tokens):

- ``Q4_0``: ``w = d · (q - 8)``, ``q`` 0..15: 4 bits, the default zero point.
- ``Q8_0``: ``w = d · q``, ``q`` -128..127: 8 bits, stored ``q + 128``.
- ``Q4_1``: ``w = d · q + m``, ``q`` 0..15, which is ``d · (q - z) + (m + z·d)`` for any
  ``z``: 4 bits at an integer zero point per block, ``z`` the nearest to ``-m/d`` in 0..15,
  plus what is left, ``r = m + z·d`` (at most half a step, ``|r| ≤ d/2``, where ``-m/d``
  lies in 0..15, as it does when a block's weights straddle 0), times ``x`` summed block
  by block (``blocksum(x) @ r``, a ``[K/32, N]`` product: few multiplications, but a
  product of its own for every matrix). The graph multiplies by
  ``r`` in 8 bits (:mod:`hecate.llm.onnx_graph` says why and what it costs). ``Q4_K``'s
  sub-blocks, ``w = s·q - mn``, go the same way, and ``Q5_K``'s in 8 bits (``q`` 0..31
  as stored, ``z`` 0..255).
- ``Q5_0``: ``w = d · (q - 16)``, ``q`` 0..31 (four bits in the nibbles, the fifth in a
  32-bit word per block): 8 bits, stored ``q + 112`` so that the default zero point, 128,
  subtracts 16. ``Q5_1``: ``w = d · q + m``: 8 bits as stored, at an integer zero point
  per block as ``Q4_1``'s (``z`` 0..255).
- ``Q3_K``: ``w = d · (sc - 32) · q``, ``q`` -4..3 (two bits, a third in a mask), a
  6-bit ``sc`` per 16 weights: 4 bits, stored ``q + 8`` at the default zero point, in
  blocks of 16.
- ``Q2_K``: ``w = d·sc·q - dmin·m``, ``q`` 0..3, a 4-bit ``sc`` and ``m`` per 16
  weights: 4 bits as stored at an integer zero point per 16, as ``Q4_K``'s.
- ``IQ4_NL``: ``w = d · table[q]``, ``q`` 0..15 an index into 16 fixed integers in
  -127..113: 8 bits, stored ``table[q] + 128`` (the default zero point). ``IQ4_XS``: the
  same table under a 6-bit scale per 32 weights (``d · (ls - 32)``) in super-blocks of
  256.

A GGUF row is one output (``N``) of ``K`` inputs, already in the order ``MatMulNBits``
wants; only the nibbles move (GGUF keeps elements ``j`` and ``j + 16`` of a block in one
byte, ``MatMulNBits`` elements ``2i`` and ``2i + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    zeros: U8 | None = None  # [N, K/block] integer zero points; None: the middle


def _blocks(raw: U8, n: int, block_bytes: int) -> U8:
    return np.ascontiguousarray(raw).reshape(n, -1, block_bytes)


def _scale(blocks: U8, at: int) -> F32:
    """The float16 at byte ``at`` of every block, as float32 [N, blocks]."""
    half = np.ascontiguousarray(blocks[:, :, at : at + 2]).view(np.float16)[..., 0]
    return half.astype(np.float32)


def _nibbles(qs: U8) -> U8:
    """GGUF's 16 bytes of a 4-bit block (elements j and j+16 in byte j) repacked as
    MatMulNBits wants them (elements 2i and 2i+1 in byte i, the even one low)."""
    return pairs(np.concatenate([qs & 0x0F, qs >> 4], axis=-1))  # the 32 values in order


def pairs(values: U8) -> U8:
    """4-bit values two to a byte along the last axis (even length), the even one in
    the low nibble, as ``MatMulNBits`` takes its weights and its zero points."""
    packed: U8 = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
    return packed


#: the weight types the engine runs (each exactly, as the module's docstring says)
SUPPORTED = (
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.IQ4_NL,
    GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q3_K,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.IQ4_XS,
)


def check_types(file: Any) -> None:
    """Raise :class:`UnsupportedWeights` naming every weight type of ``file`` (a
    :class:`~hecate.llm.gguf_file.GGUFFile`) the engine has no kernel for, in one
    message, each with the first matrix of that type and how many more there are: found
    when a model is added, not by a node."""
    lacking: dict[GGMLQuantizationType, list[str]] = {}
    for name, t in file.tensors.items():
        if len(t.shape) >= 2 and t.tensor_type not in SUPPORTED:
            lacking.setdefault(t.tensor_type, []).append(name)
    if lacking:
        said = "; ".join(
            f"{names[0]}: weight type {kind.name} is not supported"
            + (f" (and {len(names) - 1} more matrices)" if len(names) > 1 else "")
            for kind, names in lacking.items()
        )
        raise UnsupportedWeights(f"{said} (supported: {', '.join(q.name for q in SUPPORTED)})")


def pack(
    name: str, kind: GGMLQuantizationType, raw: npt.NDArray[np.generic], n: int, k: int
) -> Packed:
    """``raw`` is the tensor's data as the GGUF reader gives it (rows of blocks, or
    floats); ``n`` outputs of ``k`` inputs each."""
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
        if kind == GGMLQuantizationType.BF16:  # float32's top half: exact in float32
            widened = np.asarray(raw).view(np.uint16).astype(np.uint32) << 16
            raw = widened.view(np.float32)
        dense = np.ascontiguousarray(np.asarray(raw, dtype=np.float32).reshape(n, k).T)
        return Packed(
            n, k, 0, BLOCK, np.zeros((0,), np.uint8), np.zeros((0,), np.float32), None, dense
        )
    raw8 = np.asarray(raw).view(np.uint8)
    if k % BLOCK:
        raise UnsupportedWeights(f"{name}: {k} inputs are not whole blocks of {BLOCK}")
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
        zeros, rest = _integer_zeros(d, m)
        return Packed(n, k, 4, BLOCK, _nibbles(b[:, :, 4:]), d.reshape(-1), rest, None, zeros)
    if kind == GGMLQuantizationType.Q5_0:
        b = _blocks(raw8, n, 6 + BLOCK // 2)
        stored = (_fives(b, 2) + 112).astype(np.uint8)  # read at 128: q - 16
        return Packed(n, k, 8, BLOCK, stored, _scale(b, 0).reshape(-1))
    if kind == GGMLQuantizationType.Q5_1:
        b = _blocks(raw8, n, 8 + BLOCK // 2)
        d, m = _scale(b, 0), _scale(b, 2)
        zeros, rest = _integer_zeros(d, m, 255)
        return Packed(n, k, 8, BLOCK, _fives(b, 4), d.reshape(-1), rest, None, zeros)
    if kind == GGMLQuantizationType.IQ4_NL:
        b = _blocks(raw8, n, 2 + BLOCK // 2)
        stored = _nl_codes(np.concatenate([b[:, :, 2:] & 0x0F, b[:, :, 2:] >> 4], axis=-1))
        return Packed(n, k, 8, BLOCK, stored, _scale(b, 0).reshape(-1))
    if kind in K_QUANTS:
        if k % QK_K:
            raise UnsupportedWeights(f"{name}: {k} inputs are not whole blocks of {QK_K}")
        return K_QUANTS[kind](raw8.reshape(-1, K_BYTES[kind]), n, k)
    raise UnsupportedWeights(
        f"{name}: weight type {kind.name} is not supported (supported: "
        f"{', '.join(q.name for q in SUPPORTED)})"
    )


def _fives(blocks: U8, at: int) -> U8:
    """The 32 five-bit values (0..31, in order) of Q5_0/Q5_1 blocks [N, blocks, bytes]
    whose high bits are the little-endian 32-bit word at byte ``at``, their nibbles the
    16 bytes after it (element ``j`` low and ``j + 16`` high in byte ``j``, as Q4_0's)."""
    high = np.unpackbits(blocks[:, :, at : at + 4], axis=-1, bitorder="little")  # bit j
    qs = blocks[:, :, at + 4 : at + 4 + BLOCK // 2]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    fives: U8 = (low | (high << 4)).astype(np.uint8)
    return np.ascontiguousarray(fives)


#: IQ4_NL's and IQ4_XS's 16 values, which their 4-bit codes index
IQ4_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int16
)


def _nl_codes(indices: U8) -> U8:
    """4-bit indices into :data:`IQ4_VALUES` as the 8-bit codes ``MatMulNBits`` reads at
    its default zero point, 128: ``value + 128``."""
    codes: U8 = (IQ4_VALUES[indices] + 128).astype(np.uint8)
    return np.ascontiguousarray(codes)


def _integer_zeros(d: F32, m: F32, top: int = 15) -> tuple[U8, F32]:
    """For blocks ``w = d·q + m`` ([N, blocks] each): the integer zero point ``z`` in
    ``0..top`` nearest ``-m/d``, and what is left, ``m + z·d`` as [blocks, N] (exact in
    float32 for Q4_1, whose ``d`` and ``m`` are float16 and ``z`` 4 bits; a k-quant's
    sub-block scales carry 6 bits more, and may round in the last bit)."""
    ratio = np.divide(-m, d, out=np.full_like(d, (top + 1) // 2), where=d != 0)
    zeros = np.clip(np.rint(ratio), 0, top).astype(np.uint8)
    rest = m + zeros.astype(np.float32) * d
    return zeros, np.ascontiguousarray(rest.T, dtype=np.float32)


# k-quants: super-blocks of 256 weights whose sub-blocks (32 weights, 16 for Q6_K) carry
# 6- or 8-bit scales of one float16 per super-block; the same layouts gguf dequantises.
QK_K = 256
K_BYTES = {
    GGMLQuantizationType.Q2_K: 84,
    GGMLQuantizationType.Q3_K: 110,
    GGMLQuantizationType.IQ4_XS: 136,
    GGMLQuantizationType.Q4_K: 144,
    GGMLQuantizationType.Q5_K: 176,
    GGMLQuantizationType.Q6_K: 210,
}


_SHIFT4 = np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)  # a byte's low, then high nibble
SUB6 = 16  # weights per Q6_K scale


def _k_scales(scales: U8) -> tuple[U8, U8]:
    """The eight 6-bit scales and mins of a Q4_K/Q5_K super-block, from its 12 bytes."""
    nb = scales.shape[0]
    d, m, m_d = np.split(scales.reshape(nb, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1).reshape(nb, 8)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1).reshape(nb, 8)
    return sc, mn


def _k_header(blocks: U8) -> tuple[F32, F32, U8]:
    """Per sub-block scale ``s`` and min ``mn`` [nb, 8] (``w = s·q - mn``), and the rest."""
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = _k_scales(np.ascontiguousarray(blocks[:, 4:16]))
    return d * sc.astype(np.float32), dmin * mn.astype(np.float32), blocks[:, 16:]


def _by_rows(q: U8, s: F32, n: int, k: int, block: int) -> tuple[U8, F32]:
    return q.reshape(n, k // block, block), np.ascontiguousarray(s.reshape(-1))


def _q4_k(blocks: U8, n: int, k: int) -> Packed:
    s, mn, qs = _k_header(blocks)
    nb = blocks.shape[0]
    q: U8 = ((qs.reshape(nb, 4, 1, 32) >> _SHIFT4) & 0x0F).astype(np.uint8)
    rows, scales = _by_rows(q.reshape(nb, 8, 32), s, n, k, BLOCK)
    packed = pairs(rows)
    # w = s·q - mn: as Q4_1's, with m = -mn
    zeros, rest = _integer_zeros(s.reshape(n, k // BLOCK), -mn.reshape(n, k // BLOCK))
    return Packed(n, k, 4, BLOCK, packed, scales, rest, None, zeros)


def _q5_k(blocks: U8, n: int, k: int) -> Packed:
    s, mn, rest = _k_header(blocks)
    nb = blocks.shape[0]
    qh, qs = rest[:, :32], rest[:, 32:]
    low = (qs.reshape(nb, 4, 1, 32) >> _SHIFT4) & 0x0F
    high = (qh.reshape(nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 0x01
    q: U8 = (low.reshape(nb, 8, 32) | (high << 4)).astype(np.uint8)  # 0..31
    rows, scales = _by_rows(q, s, n, k, BLOCK)
    # 8 bits as stored (0..31), at an integer zero point per sub-block, as Q4_K's:
    # w = s·q - mn = s(q - z) + (s·z - mn).
    zeros, left = _integer_zeros(s.reshape(n, k // BLOCK), -mn.reshape(n, k // BLOCK), 255)
    return Packed(n, k, 8, BLOCK, np.ascontiguousarray(rows), scales, left, None, zeros)


def _q6_k(blocks: U8, n: int, k: int) -> Packed:
    nb = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
    low = (ql.reshape(nb, 2, 1, 64) >> _SHIFT4) & 0x0F
    high = (qh.reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q: U8 = (low.reshape(nb, 8, 32) | (high.reshape(nb, 8, 32) << 4)).astype(np.uint8)  # 0..63
    rows, scales = _by_rows(q.reshape(nb, QK_K // SUB6, SUB6), d * sc, n, k, SUB6)
    stored = (rows.astype(np.int16) + 96).astype(np.uint8)  # read as q - 32: stored q + 96
    return Packed(n, k, 8, SUB6, stored, scales)


def _iq4_xs(blocks: U8, n: int, k: int) -> Packed:
    nb = blocks.shape[0]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [nb, 1]
    high = blocks[:, 2:4].copy().view(np.uint16)  # two bits of each sub-block's scale
    low = (blocks[:, 4:8].reshape(nb, 4, 1) >> _SHIFT4.reshape(1, 1, 2)) & 0x0F
    ib = np.arange(8, dtype=np.uint16).reshape(1, 8)
    ls = low.reshape(nb, 8).astype(np.int16) | (((high >> (2 * ib)) & 3).astype(np.int16) << 4)
    s = d * (ls - 32).astype(np.float32)  # [nb, 8]
    qs = blocks[:, 8:].reshape(nb, 8, 16)
    codes = _nl_codes(np.concatenate([qs & 0x0F, qs >> 4], axis=-1))  # [nb, 8, 32]
    rows, scales = _by_rows(codes, s, n, k, BLOCK)
    return Packed(n, k, 8, BLOCK, np.ascontiguousarray(rows), scales)


def _q3_k(blocks: U8, n: int, k: int) -> Packed:
    nb = blocks.shape[0]
    hmask, qs, packed = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
    d = blocks[:, 108:110].copy().view(np.float16).astype(np.float32)  # [nb, 1]
    low = (packed[:, :8].reshape(nb, 1, 8) >> _SHIFT4.reshape(1, 2, 1)).reshape(nb, 16) & 0x0F
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)
    high = (packed[:, 8:].reshape(nb, 1, 4) >> shifts).reshape(nb, 16) & 0x03
    sc = (low | (high << 4)).astype(np.int16) - 32
    ql = (qs.reshape(nb, 2, 1, 32) >> shifts.reshape(1, 1, 4, 1)).reshape(nb, 16, 16) & 3
    bits = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    qh = (hmask.reshape(nb, 1, 32) >> bits).reshape(nb, 16, 16) & 1
    q = ql.astype(np.int16) - ((qh ^ 1).astype(np.int16) << 2)  # -4..3
    rows, scales = _by_rows((q + 8).astype(np.uint8), d * sc.astype(np.float32), n, k, SUB6)
    return Packed(n, k, 4, SUB6, pairs(rows), scales)


def _q2_k(blocks: U8, n: int, k: int) -> Packed:
    nb = blocks.shape[0]
    sc, qs = blocks[:, :16], blocks[:, 16:80]
    d = blocks[:, 80:82].copy().view(np.float16).astype(np.float32)  # [nb, 1]
    dmin = blocks[:, 82:84].copy().view(np.float16).astype(np.float32)
    s, mn = d * (sc & 0x0F).astype(np.float32), dmin * (sc >> 4).astype(np.float32)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q: U8 = ((qs.reshape(nb, 2, 1, 32) >> shifts) & 3).astype(np.uint8).reshape(nb, 16, 16)
    rows, scales = _by_rows(q, s, n, k, SUB6)
    # w = s·q - mn = s(q - z) + (s·z - mn), as Q4_K's
    zeros, rest = _integer_zeros(s.reshape(n, k // SUB6), -mn.reshape(n, k // SUB6))
    return Packed(n, k, 4, SUB6, pairs(rows), scales, rest, None, zeros)


K_QUANTS = {
    GGMLQuantizationType.Q2_K: _q2_k,
    GGMLQuantizationType.Q3_K: _q3_k,
    GGMLQuantizationType.IQ4_XS: _iq4_xs,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}


def unpack(p: Packed) -> F32:
    """The float32 matrix [K, N] ``p`` stands for (what tests hold the kernel against)."""
    if p.dense is not None:
        return p.dense
    blocks = p.k // p.block
    if p.bits == 8:
        q = p.data.astype(np.float32).reshape(p.n, blocks, p.block)
        q -= 128.0 if p.zeros is None else p.zeros.reshape(p.n, blocks, 1).astype(np.float32)
    else:
        low, high = p.data & 0x0F, p.data >> 4
        q = np.stack([low, high], axis=-1).reshape(p.n, blocks, p.block).astype(np.float32)
        q -= 8.0 if p.zeros is None else p.zeros.reshape(p.n, blocks, 1).astype(np.float32)
    w = q * p.scales.reshape(p.n, blocks, 1)
    if p.offset is not None:
        w = w + p.offset.T.reshape(p.n, blocks, 1)
    return np.ascontiguousarray(w.reshape(p.n, p.k).T, dtype=np.float32)
