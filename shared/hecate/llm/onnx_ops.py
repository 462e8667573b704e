"""The pieces an ONNX graph of the engine is built of: :class:`Graph`, which adds nodes
and constants as it goes (every constant past :data:`INLINE_BYTES` handed over beside
the protobuf, never serialized into it), and the weight products, a file's blocks as
``MatMulNBits`` takes them (:mod:`hecate.llm.quant` repacks them) or float32 ``MatMul``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from hecate.llm.quant import F32, U8, Packed, pairs

#: int8 activations in MatMulNBits, as llama.cpp quantises its activations to Q8: the
#: fast path on CPUs (without it a 4-bit product is 20 times slower).
ACCURACY_LEVEL = 4
MS = "com.microsoft"
#: constants at most this large go inside the protobuf; larger ones are handed over
INLINE_BYTES = 1024
#: a MatMulNBits' weight inputs in order: its integers, scales and zero points
ROLES = ("q", "s", "z")
#: what :attr:`~hecate.llm.onnx_graph.Built.packed` says of a float32 MatMul's weight:
#: no bits, no block
DENSE = (0, 0, "dense")


class Graph:
    """Builds the range's graph node by node; initializers go in as it goes."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.weights: dict[str, npt.NDArray[Any]] = {}
        #: the weights that are a MatMulNBits' inputs: its bits, block and the input
        self.packed: dict[str, tuple[int, int, str]] = {}
        self._n = 0

    @contextmanager
    def branch(self) -> Iterator[list[onnx.NodeProto]]:
        """Nodes made inside go to the list given (an ``If``'s branch), not the graph;
        constants still to the graph's initializers, which a branch reads from the
        outer scope. The runtime prepacks those as it does the graph's own (a stage of
        experts whose kept weights were all zeroed once built answered the same), so
        what it leaves unread is dropped alike (``onnx_load.left_unread``)."""
        outer, self.nodes = self.nodes, []
        try:
            yield self.nodes
        finally:
            self.nodes = outer

    def name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}.{self._n}"

    def const(self, stem: str, value: npt.NDArray[Any]) -> str:
        name = self.name(stem)
        if value.nbytes <= INLINE_BYTES:
            self.inits.append(numpy_helper.from_array(value, name))
            return name
        # A placeholder: its type and shape, its bytes "elsewhere" (ONNX Runtime takes
        # them from the session's options, by name, before it would read any file).
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype))
        t.dims.extend(value.shape)
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value="handed-over")
        self.inits.append(t)
        self.weights[name] = np.ascontiguousarray(value)
        return name

    def op(
        self, kind: str, inputs: Sequence[str], outputs: int = 1, domain: str = "", **attrs: Any
    ) -> list[str]:
        names = [self.name(kind) for _ in range(outputs)]
        self.nodes.append(helper.make_node(kind, list(inputs), names, domain=domain, **attrs))
        return names

    def rms_norm(self, x: str, weight: npt.NDArray[np.float32], eps: float, stem: str) -> str:
        """``x`` RMS-normed over its last axis, times ``weight``."""
        w = self.const(stem, weight)
        return self.op("SimplifiedLayerNormalization", [x, w], epsilon=eps, axis=-1)[0]

    def linear(self, x: str, w: Packed, stem: str) -> str:
        if w.dense is not None:
            return self.matmul(x, self.const(f"{stem}.w", w.dense))
        inputs = [x, self.const(f"{stem}.q", w.data), self.const(f"{stem}.s", w.scales)]
        if w.zeros is not None:
            zeros = _nibble_pairs(w.zeros) if w.bits == 4 else w.zeros.reshape(-1)
            inputs.append(self.const(f"{stem}.z", zeros))
        out = self.nbits(inputs, w.k, w.n, w.bits, w.block)
        if w.offset is None:
            return out
        shape = self.const(f"{stem}.shape", np.array([0, 0, w.k // w.block, w.block], np.int64))
        blocks = self.op("Reshape", [x, shape])[0]
        axes = self.const(f"{stem}.axes", np.array([-1], np.int64))
        sums = self.op("ReduceSum", [blocks, axes], keepdims=0)[0]
        if w.zeros is None or not _within_half_a_step(w):  # in float32
            shift = self.matmul(sums, self.const(f"{stem}.m", w.offset))
        else:
            q, scales = _eight_bits(w.offset)
            rest = [sums, self.const(f"{stem}.r", q), self.const(f"{stem}.rs", scales)]
            shift = self.nbits(rest, w.k // w.block, w.n, 8, RESIDUAL_BLOCK)
        return self.op("Add", [out, shift])[0]

    def matmul(self, x: str, w: str) -> str:
        """``x @ w``, ``w`` a float32 constant (:data:`DENSE`: the kernel may pack it)."""
        if w in self.weights:
            self.packed[w] = DENSE
        return self.op("MatMul", [x, w])[0]

    def nbits(self, inputs: list[str], k: int, n: int, bits: int, block: int) -> str:
        for name, role in zip(inputs[1:], ROLES, strict=False):
            if name in self.weights:
                self.packed[name] = (bits, block, role)
        return self.op(
            "MatMulNBits",
            inputs,
            domain=MS,
            K=k,
            N=n,
            bits=bits,
            block_size=block,
            accuracy_level=ACCURACY_LEVEL,
        )[0]


#: The blocks of what integer zero points leave of a Q4_1, Q4_K or Q5_K offset, multiplied in
#: 8 bits (:func:`_eight_bits`).
RESIDUAL_BLOCK = 32


def _within_half_a_step(w: Packed) -> bool:
    """Whether every block's residual is at most half its step (as where the block's
    weights straddle 0): what makes :func:`_eight_bits`'s error small. A block wholly
    on one side of 0 keeps more (its zero point clipped to 0 or 15), and the matrix's
    residual then goes in float32."""
    assert w.offset is not None
    steps = np.abs(w.scales.reshape(w.n, -1).T)
    return bool(np.all(np.abs(w.offset) <= 0.5 * steps * (1 + 1e-6)))


def _nibble_pairs(zeros: U8) -> U8:
    """[N, blocks] 4-bit zero points as MatMulNBits takes them: two a byte, the even
    block's low, each row padded to whole bytes."""
    if zeros.shape[1] % 2:
        zeros = np.concatenate([zeros, np.zeros((zeros.shape[0], 1), np.uint8)], axis=1)
    return pairs(zeros).reshape(-1)


def _eight_bits(rest: F32) -> tuple[U8, F32]:
    """``rest`` [blocks, N] (what integer zero points leave: at most half a weight step)
    as MatMulNBits' 8-bit blocks along its inputs: symmetric, a scale per 32.

    Why not float32, exactly: a ``[1, K/32] x [K/32, N]`` float product is a product of
    its own a layer, reading 4 bytes a weight block; over SmolLM2's 150 products it took
    about a quarter of a decode step (measured against the same graph without it). In 8
    bits it runs on the int8 kernel at a quarter of the bytes. What it costs in
    precision: each residual is off by at most 1/254 of the largest in its column's
    block of 32, itself at most half the block's step, so a weight moves by at most
    about 1/500 of a quantisation step; llama.cpp's own kernel keeps a block's input sum
    in float16 (off by up to 1/2048 of it, times an offset up to 8 steps): the same order.
    Held by the tests against llama.cpp's logits and the numpy model's."""
    k, n = rest.shape
    padded = -(-k // RESIDUAL_BLOCK) * RESIDUAL_BLOCK
    r = np.zeros((n, padded), np.float32)
    r[:, :k] = rest.T
    r = r.reshape(n, padded // RESIDUAL_BLOCK, RESIDUAL_BLOCK)
    top = np.abs(r).max(axis=-1) / 127.0
    scales = np.where(top == 0, 1.0, top).astype(np.float32)
    q = np.clip(np.rint(r / scales[..., None]), -127, 127) + 128
    return q.astype(np.uint8), np.ascontiguousarray(scales.reshape(-1))


def linear_of(g: Graph, x: str, parts: list[Packed], stem: str) -> str:
    fused = _fuse(parts)
    if fused is not None:
        return g.linear(x, fused, stem)
    outs = [g.linear(x, p, f"{stem}.{j}") for j, p in enumerate(parts)]
    return g.op("Concat", outs, axis=-1)[0]


def _fuse(parts: list[Packed]) -> Packed | None:
    """Several matrices on the same input as one (outputs stacked), when their types agree."""
    first = parts[0]

    def kind(p: Packed) -> tuple[int, int, bool, bool, bool]:
        return (p.bits, p.block, p.offset is None, p.dense is None, p.zeros is None)

    if any(kind(p) != kind(first) for p in parts):
        return None
    n = sum(p.n for p in parts)
    if first.dense is not None:
        dense = np.concatenate([p.dense for p in parts if p.dense is not None], axis=1)
        return Packed(n, first.k, 0, first.block, first.data, first.scales, None, dense)
    offset = None
    if first.offset is not None:
        offset = np.concatenate([p.offset for p in parts if p.offset is not None], axis=1)
    zeros = None
    if first.zeros is not None:
        zeros = np.concatenate([p.zeros for p in parts if p.zeros is not None])
    return Packed(
        n,
        first.k,
        first.bits,
        first.block,
        np.concatenate([p.data for p in parts]),
        np.concatenate([p.scales for p in parts]),
        offset,
        None,
        zeros,
    )
