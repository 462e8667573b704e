"""The ONNX graph of a llama layer range ``[a, b)``, built from a GGUF's own blocks
(see :mod:`hecate.llm.onnx_stage`, which runs it, for what the graph holds and why).

Weights go in as the file stores them, repacked for ``MatMulNBits`` where the runtime
has a kernel for their type (:mod:`hecate.llm.quant`); norms and biases as float32.
Every constant past :data:`INLINE_BYTES` stays out of the graph's protobuf: the graph
names it and :class:`Built` hands the array over (as ONNX Runtime's external
initializers, used where they lie), so no serialized copy of the weights is ever made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from onnx import TensorProto, helper, numpy_helper

from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import LlamaConfig
from hecate.llm.kv_pool import KV_TYPE, KvType
from hecate.llm.quant import F32, U8, Packed, pack, pairs

#: int8 activations in MatMulNBits, as llama.cpp quantises its activations to Q8: the
#: fast path on CPUs (without it a 4-bit product is 20 times slower).
ACCURACY_LEVEL = 4
MS = "com.microsoft"
#: constants at most this large go inside the protobuf; larger ones are handed over
INLINE_BYTES = 1024
#: a MatMulNBits' weight inputs in order: its integers, scales and zero points
ROLES = ("q", "s", "z")
#: what :attr:`Built.packed` says of a float32 MatMul's weight: no bits, no block
DENSE = (0, 0, "dense")


@dataclass
class Built:
    """A range's graph, its output's name (``logits`` on the last stage, else
    ``hidden``), the arrays its external initializers name, and which of them are
    ``MatMulNBits``' integers, scales or zero points (with its bits and block, and
    which of :data:`ROLES`) or a float ``MatMul``'s weight (:data:`DENSE`), which the
    runtime may pack into a copy of its own."""

    model: onnx.ModelProto
    out: str
    weights: dict[str, npt.NDArray[Any]]
    packed: dict[str, tuple[int, int, str]]


def build(
    file: GGUFFile,
    c: LlamaConfig,
    layer_start: int,
    layer_end: int,
    capacity: int,
    kv_type: KvType = KV_TYPE,
) -> Built:
    """The graph of blocks ``[layer_start, layer_end)`` with KV caches of ``capacity``
    positions, kept in ``kv_type``.

    In float16 (as llama.cpp keeps its cache): the attention runs in float16, its
    inputs cast to it where the product leaves them (Q with K and V, as llama.cpp's CPU
    kernels round Q to the type of the K they multiply), its output cast back to
    float32. A position's key is thus the same number whether it is read from the cache
    or was computed in the same run (a prompt's rows attend to each other as a cached
    prefix's rows are attended to); ``GroupQueryAttention`` with float32 inputs and a
    float16 cache would not be (it attends to the run's own keys unrounded)."""
    tensors = file.tensors
    last = layer_end == c.layers

    def packed(name: str) -> Packed:
        t = tensors[f"{name}.weight"]
        k, n = int(t.shape[0]), int(t.shape[1])
        return pack(t.name, GGMLQuantizationType(t.tensor_type), t.data, n, k)

    def vector(name: str, part: str = "weight") -> npt.NDArray[np.float32]:
        t = tensors[f"{name}.{part}"]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)

    g = Graph()
    d, kv = c.head_dim, c.kv_heads
    angles = np.arange(capacity, dtype=np.float64)[:, None] * c.inverse_frequencies()
    kv_proto = helper.np_dtype_to_tensor_dtype(np.dtype(kv_type))
    cos = g.const("cos", np.cos(angles).astype(kv_type))
    sin = g.const("sin", np.sin(angles).astype(kv_type))
    x, resid, pending = "x", "", ""
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", c.hidden]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total_len", TensorProto.INT32, []),
    ]
    outputs: list[onnx.ValueInfoProto] = []
    cache_shape: list[str | int | None] = ["B", kv, capacity, d]
    for i in range(layer_start, layer_end):
        b = f"blk.{i}"
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}.{i}", kv_proto, cache_shape))
            outputs.append(
                helper.make_tensor_value_info(f"present_{kind}.{i}", kv_proto, cache_shape)
            )
        norm = g.const(f"{b}.attn_norm", vector(f"{b}.attn_norm"))
        if not pending and i == 0:
            h = g.op("SimplifiedLayerNormalization", [x, norm], epsilon=c.eps, axis=-1)[0]
            resid = x
        elif not pending:
            # A later stage's first block: the incoming hidden state is the sum the
            # whole model's SkipSimplifiedLayerNormalization would have made here.
            # The same kernel normalises it (x + 0 is x), so a range cut in stages
            # computes the very numbers of the range in one piece: another norm
            # kernel differs in the last bits, which int8 activations can turn into
            # another token at a near-tie.
            zero = g.const(f"{b}.zero", np.zeros((), np.float32))
            nothing = g.op("Mul", [x, zero])[0]
            h, _, _, resid = g.op(
                "SkipSimplifiedLayerNormalization",
                [x, nothing, norm],
                4,
                domain=MS,
                epsilon=c.eps,
            )
        else:
            h, _, _, resid = g.op(
                "SkipSimplifiedLayerNormalization",
                [pending, resid, norm],
                4,
                domain=MS,
                epsilon=c.eps,
            )
        qkv = linear_of(g, h, [packed(f"{b}.attn_{n}") for n in ("q", "k", "v")], f"{b}.qkv")
        if c.qkv_bias:
            bias = np.concatenate([vector(f"{b}.attn_{n}", "bias") for n in ("q", "k", "v")])
            qkv = g.op("Add", [qkv, g.const(f"{b}.bqkv", bias)])[0]
        attn = f"{b}.attn"
        if kv_proto != TensorProto.FLOAT:
            qkv = g.op("Cast", [qkv], to=kv_proto)[0]
            attn = g.name(f"{b}.attn_{np.dtype(kv_type).name}")
        g.nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [
                    qkv,
                    "",
                    "",
                    f"past_key.{i}",
                    f"past_value.{i}",
                    "seqlens_k",
                    "total_len",
                    cos,
                    sin,
                ],
                [attn, f"present_key.{i}", f"present_value.{i}"],
                domain=MS,
                num_heads=c.heads,
                kv_num_heads=kv,
                do_rotary=1,
                rotary_interleaved=int(c.rope_interleaved),
                scale=float(1.0 / np.sqrt(d)),
            )
        )
        if attn != f"{b}.attn":
            g.nodes.append(helper.make_node("Cast", [attn], [f"{b}.attn"], to=TensorProto.FLOAT))
        o = g.linear(f"{b}.attn", packed(f"{b}.attn_output"), f"{b}.wo")
        ffn_norm = g.const(f"{b}.ffn_norm", vector(f"{b}.ffn_norm"))
        h2, _, _, resid = g.op(
            "SkipSimplifiedLayerNormalization",
            [o, resid, ffn_norm],
            4,
            domain=MS,
            epsilon=c.eps,
        )
        # One product for both (their outputs side by side), as for Q, K and V.
        both = linear_of(g, h2, [packed(f"{b}.ffn_gate"), packed(f"{b}.ffn_up")], f"{b}.ffn")
        halves = g.const(f"{b}.halves", np.array([c.ffn, c.ffn], np.int64))
        gate, up = g.op("Split", [both, halves], 2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])[0]])[0], up])[0]
        pending = g.linear(act, packed(f"{b}.ffn_down"), f"{b}.down")
    if last:
        out_norm = g.const("output_norm", vector("output_norm"))
        normed = g.op(
            "SkipSimplifiedLayerNormalization",
            [pending, resid, out_norm],
            4,
            domain=MS,
            epsilon=c.eps,
        )[0]
        starts = g.const("last.start", np.array([-1], np.int64))
        ends = g.const("last.end", np.array([np.iinfo(np.int64).max], np.int64))
        axes = g.const("last.axis", np.array([1], np.int64))
        tail = g.op("Slice", [normed, starts, ends, axes])[0]
        head_name = "token_embd" if c.tied_head else "output"
        logits = g.linear(tail, packed(head_name), "head")
        squeeze = g.const("last.squeeze", np.array([1], np.int64))
        g.nodes.append(helper.make_node("Squeeze", [logits, squeeze], ["logits"]))
        outputs.insert(
            0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", c.vocab])
        )
        out = "logits"
    else:
        g.nodes.append(helper.make_node("Add", [pending, resid], ["hidden"]))
        outputs.insert(
            0, helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "S", c.hidden])
        )
        out = "hidden"
    graph = helper.make_graph(
        g.nodes, f"llama[{layer_start},{layer_end})", inputs, outputs, g.inits
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 10
    return Built(model, out, g.weights, g.packed)


class Graph:
    """Builds the range's graph node by node; initializers go in as it goes."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.weights: dict[str, npt.NDArray[Any]] = {}
        #: the weights that are a MatMulNBits' inputs: its bits, block and the input
        self.packed: dict[str, tuple[int, int, str]] = {}
        self._n = 0

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
