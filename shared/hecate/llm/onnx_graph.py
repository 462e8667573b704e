"""The ONNX graph of a llama layer range ``[a, b)``, built from a GGUF's own blocks
(see :mod:`hecate.llm.onnx_stage`, which runs it, for what the graph holds and why).

Weights go in as the file stores them, repacked for ``MatMulNBits`` where the runtime
has a kernel for their type (:mod:`hecate.llm.quant`); norms and biases as float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from onnx import TensorProto, helper, numpy_helper

from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import LlamaConfig
from hecate.llm.quant import Packed, pack

#: int8 activations in MatMulNBits, as llama.cpp quantises its activations to Q8: the
#: fast path on CPUs (without it a 4-bit product is 20 times slower).
ACCURACY_LEVEL = 4
MS = "com.microsoft"


def build(
    file: GGUFFile, c: LlamaConfig, layer_start: int, layer_end: int, capacity: int
) -> tuple[onnx.ModelProto, str]:
    """The graph of blocks ``[layer_start, layer_end)`` with KV caches of ``capacity``
    positions, and the name of its output (``logits`` on the last stage, else
    ``hidden``)."""
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
    cos = g.const("cos", np.cos(angles).astype(np.float32))
    sin = g.const("sin", np.sin(angles).astype(np.float32))
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
            inputs.append(
                helper.make_tensor_value_info(f"past_{kind}.{i}", TensorProto.FLOAT, cache_shape)
            )
            outputs.append(
                helper.make_tensor_value_info(f"present_{kind}.{i}", TensorProto.FLOAT, cache_shape)
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
                [f"{b}.attn", f"present_key.{i}", f"present_value.{i}"],
                domain=MS,
                num_heads=c.heads,
                kv_num_heads=kv,
                do_rotary=1,
                rotary_interleaved=int(c.rope_interleaved),
                scale=float(1.0 / np.sqrt(d)),
            )
        )
        o = g.linear(f"{b}.attn", packed(f"{b}.attn_output"), f"{b}.wo")
        ffn_norm = g.const(f"{b}.ffn_norm", vector(f"{b}.ffn_norm"))
        h2, _, _, resid = g.op(
            "SkipSimplifiedLayerNormalization",
            [o, resid, ffn_norm],
            4,
            domain=MS,
            epsilon=c.eps,
        )
        gate = g.linear(h2, packed(f"{b}.ffn_gate"), f"{b}.gate")
        up = g.linear(h2, packed(f"{b}.ffn_up"), f"{b}.up")
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
    return model, out


class Graph:
    """Builds the range's graph node by node; initializers go in as it goes."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}.{self._n}"

    def const(self, stem: str, value: npt.NDArray[Any]) -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(
        self, kind: str, inputs: Sequence[str], outputs: int = 1, domain: str = "", **attrs: Any
    ) -> list[str]:
        names = [self.name(kind) for _ in range(outputs)]
        self.nodes.append(helper.make_node(kind, list(inputs), names, domain=domain, **attrs))
        return names

    def linear(self, x: str, w: Packed, stem: str) -> str:
        if w.dense is not None:
            return self.op("MatMul", [x, self.const(f"{stem}.w", w.dense)])[0]
        out = self.op(
            "MatMulNBits",
            [x, self.const(f"{stem}.q", w.data), self.const(f"{stem}.s", w.scales)],
            domain=MS,
            K=w.k,
            N=w.n,
            bits=w.bits,
            block_size=w.block,
            accuracy_level=ACCURACY_LEVEL,
        )[0]
        if w.offset is None:
            return out
        shape = self.const(f"{stem}.shape", np.array([0, 0, w.k // w.block, w.block], np.int64))
        blocks = self.op("Reshape", [x, shape])[0]
        axes = self.const(f"{stem}.axes", np.array([-1], np.int64))
        sums = self.op("ReduceSum", [blocks, axes], keepdims=0)[0]
        shift = self.op("MatMul", [sums, self.const(f"{stem}.m", w.offset)])[0]
        return self.op("Add", [out, shift])[0]


def linear_of(g: Graph, x: str, parts: list[Packed], stem: str) -> str:
    fused = _fuse(parts)
    if fused is not None:
        return g.linear(x, fused, stem)
    outs = [g.linear(x, p, f"{stem}.{j}") for j, p in enumerate(parts)]
    return g.op("Concat", outs, axis=-1)[0]


def _fuse(parts: list[Packed]) -> Packed | None:
    """Several matrices on the same input as one (outputs stacked), when their types agree."""
    first = parts[0]
    if any(
        (p.bits, p.block, p.offset is None, p.dense is None)
        != (first.bits, first.block, first.offset is None, first.dense is None)
        for p in parts
    ):
        return None
    n = sum(p.n for p in parts)
    if first.dense is not None:
        dense = np.concatenate([p.dense for p in parts if p.dense is not None], axis=1)
        return Packed(n, first.k, 0, first.block, first.data, first.scales, None, dense)
    offset = None
    if first.offset is not None:
        offset = np.concatenate([p.offset for p in parts if p.offset is not None], axis=1)
    return Packed(
        n,
        first.k,
        first.bits,
        first.block,
        np.concatenate([p.data for p in parts]),
        np.concatenate([p.scales for p in parts]),
        offset,
    )
