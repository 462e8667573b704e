"""The ONNX graph of a llama-family layer range ``[a, b)``, built from a GGUF's own
blocks (see :mod:`hecate.llm.onnx_stage`, which runs it, for what the graph holds and
why), with what its architecture adds to llama's block (:mod:`hecate.llm.gguf_config`).

Weights go in as the file stores them, repacked for ``MatMulNBits`` where the runtime
has a kernel for their type (:mod:`hecate.llm.quant`); norms and biases as float32.
Every constant past :data:`INLINE_BYTES` stays out of the graph's protobuf: the graph
names it and :class:`Built` hands the array over (as ONNX Runtime's external
initializers, used where they lie), so no serialized copy of the weights is ever made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from onnx import TensorProto, helper

from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import LlamaConfig
from hecate.llm.kv_pool import KV_TYPE, KvType
from hecate.llm.onnx_ops import ACCURACY_LEVEL, DENSE, INLINE_BYTES, MS, ROLES, Graph, linear_of
from hecate.llm.quant import Packed, pack

__all__ = ["ACCURACY_LEVEL", "DENSE", "INLINE_BYTES", "MS", "ROLES", "Built", "Graph", "build"]


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
    kv_proto = helper.np_dtype_to_tensor_dtype(np.dtype(kv_type))
    rotations: dict[bool, tuple[str, str]] = {}  # sliding or not: RoPE's cos and sin
    for sliding in sorted({c.slides(i) for i in range(layer_start, layer_end)}):
        inv = c.inverse_frequencies(sliding)
        angles = np.arange(capacity, dtype=np.float64)[:, None] * inv
        rotations[sliding] = (
            g.const("cos", np.cos(angles).astype(kv_type)),
            g.const("sin", np.sin(angles).astype(kv_type)),
        )
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
        qkv_parts = ("qkv",) if c.fused else ("q", "k", "v")
        qkv = linear_of(g, h, [packed(f"{b}.attn_{n}") for n in qkv_parts], f"{b}.qkv")
        if c.qkv_bias:
            bias = np.concatenate([vector(f"{b}.attn_{n}", "bias") for n in ("q", "k", "v")])
            qkv = g.op("Add", [qkv, g.const(f"{b}.bqkv", bias)])[0]
        # Q, K and V packed in one input, or (normed per head) one each.
        qkv_in = [qkv, "", ""] if not c.qk_norm else _normed_heads(g, c, qkv, vector, b)
        attn = f"{b}.attn"
        if kv_proto != TensorProto.FLOAT:
            qkv_in = [g.op("Cast", [t], to=kv_proto)[0] if t else t for t in qkv_in]
            attn = g.name(f"{b}.attn_{np.dtype(kv_type).name}")
        cos, sin = rotations[c.slides(i)]
        g.nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [
                    *qkv_in,
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
                scale=float(c.scale),
                # The kernel's window counts the query's own position, as llama.cpp's
                # does (measured: one less differs from a prompt of window rows on).
                local_window_size=c.window if c.slides(i) else -1,
            )
        )
        if attn != f"{b}.attn":
            g.nodes.append(helper.make_node("Cast", [attn], [f"{b}.attn"], to=TensorProto.FLOAT))
        o = g.linear(f"{b}.attn", packed(f"{b}.attn_output"), f"{b}.wo")
        if c.post_norms:
            o = g.rms_norm(o, vector(f"{b}.post_attention_norm"), c.eps, f"{b}.post_attn")
        ffn_norm = g.const(f"{b}.ffn_norm", vector(f"{b}.ffn_norm"))
        h2, _, _, resid = g.op(
            "SkipSimplifiedLayerNormalization",
            [o, resid, ffn_norm],
            4,
            domain=MS,
            epsilon=c.eps,
        )
        # One product for both (their outputs side by side), as for Q, K and V.
        if c.experts:
            pending = _experts(g, c, h2, file, b)
        else:
            gate_up = ("ffn_up",) if c.fused else ("ffn_gate", "ffn_up")
            parts = [packed(f"{b}.{n}") for n in gate_up]
            pending = _ffn(g, c, h2, parts, packed(f"{b}.ffn_down"), b)
        if c.post_norms:
            pending = g.rms_norm(pending, vector(f"{b}.post_ffw_norm"), c.eps, f"{b}.post_ffn")
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
        if c.logit_softcap:
            cap = g.const("softcap", np.array(c.logit_softcap, np.float32))
            logits = g.op("Mul", [g.op("Tanh", [g.op("Div", [logits, cap])[0]])[0], cap])[0]
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


def _ffn(g: Graph, c: LlamaConfig, h: str, gate_up: list[Packed], down: Packed, stem: str) -> str:
    """The feed-forward of ``h``: its gate and up in one product (their outputs side
    by side, as for Q, K and V), the gate through SiLU or GELU, then down."""
    both = linear_of(g, h, gate_up, f"{stem}.ffn")
    width = down.k
    halves = g.const(f"{stem}.halves", np.array([width, width], np.int64))
    gate, up = g.op("Split", [both, halves], 2, axis=-1)
    if c.gelu:  # by tanh's approximation, as llama.cpp's ggml_gelu
        gated = g.op("FastGelu", [gate], domain=MS)[0]
    else:
        gated = g.op("Mul", [gate, g.op("Sigmoid", [gate])[0]])[0]
    act = g.op("Mul", [gated, up])[0]
    return g.linear(act, down, f"{stem}.down")


#: what the sum of a position's top-k router weights is kept above (llama.cpp's)
WEIGHTS_FLOOR = 2.0**-14


def _experts(g: Graph, c: LlamaConfig, h: str, file: GGUFFile, b: str) -> str:
    """A mixture of experts, as llama.cpp runs it: the router's softmax over every
    expert, each position's top k with their weights renormalised to one, each expert's
    feed-forward weighed by them and summed. An expert no position of the run chose is
    not computed (an ``If`` on its weights), so a decode step reads the weights of the
    experts its rows chose, not of them all."""
    t = file.tensors
    router = t[f"{b}.ffn_gate_inp.weight"]
    dense = np.asarray(dequantize(router.data, router.tensor_type), np.float32)
    logits = g.matmul(h, g.const(f"{b}.router", np.ascontiguousarray(dense.T)))
    probs = g.op("Softmax", [logits], axis=-1)[0]
    k = g.const(f"{b}.k", np.array([c.experts_used], np.int64))
    top, chosen = g.op("TopK", [probs, k], 2, axis=-1, largest=1, sorted=1)
    axis = g.const(f"{b}.last", np.array([-1], np.int64))
    total = g.op("ReduceSum", [top, axis], keepdims=1)[0]
    floor = g.const(f"{b}.floor", np.array(WEIGHTS_FLOOR, np.float32))
    top = g.op("Div", [top, g.op("Max", [total, floor])[0]])[0]
    zero = g.const(f"{b}.zero", np.array(0.0, np.float32))
    weights = g.op("ScatterElements", [g.op("Mul", [probs, zero])[0], chosen, top], axis=-1)[0]

    def expert(name: str, e: int) -> Packed:
        w = t[f"{b}.{name}.weight"]
        n, kk = int(w.shape[1]), int(w.shape[0])
        return pack(f"{w.name}[{e}]", GGMLQuantizationType(w.tensor_type), w.data[e], n, kk)

    outs = []
    for e in range(c.experts):
        starts = g.const(f"{b}.e{e}.start", np.array([e], np.int64))
        ends = g.const(f"{b}.e{e}.end", np.array([e + 1], np.int64))
        weight = g.op("Slice", [weights, starts, ends, axis])[0]  # [B, S, 1]
        chose = g.op("Greater", [g.op("ReduceMax", [weight], keepdims=0)[0], zero])[0]
        with g.branch() as nodes:
            parts = [expert("ffn_gate_exps", e), expert("ffn_up_exps", e)]
            y = _ffn(g, c, h, parts, expert("ffn_down_exps", e), f"{b}.e{e}")
            y = g.op("Mul", [y, weight])[0]
        then = helper.make_graph(
            nodes, f"{b}.e{e}.then", [], [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)]
        )
        nothing = g.name(f"{b}.e{e}.none")
        otherwise = helper.make_graph(
            [helper.make_node("Constant", [], [nothing], value_float=0.0)],
            f"{b}.e{e}.else",
            [],
            [helper.make_tensor_value_info(nothing, TensorProto.FLOAT, None)],
        )
        outs.append(g.op("If", [chose], then_branch=then, else_branch=otherwise)[0])
    return g.op("Sum", outs)[0]


def _normed_heads(
    g: Graph,
    c: LlamaConfig,
    qkv: str,
    vector: Callable[[str], npt.NDArray[np.float32]],
    b: str,
) -> list[str]:
    """Q, K and V out of their fused product, each head of Q and of K RMS-normed (its
    ``attn_q_norm``/``attn_k_norm``) before the attention rotates them."""
    d = c.head_dim
    widths = g.const(
        f"{b}.qkv_widths", np.array([c.heads * d, c.kv_heads * d, c.kv_heads * d], np.int64)
    )
    q, k, v = g.op("Split", [qkv, widths], 3, axis=-1)
    out = []
    for x, heads, name in ((q, c.heads, "attn_q_norm"), (k, c.kv_heads, "attn_k_norm")):
        by_head = g.const(f"{b}.{name}.heads", np.array([0, 0, heads, d], np.int64))
        whole = g.const(f"{b}.{name}.whole", np.array([0, 0, heads * d], np.int64))
        split = g.op("Reshape", [x, by_head])[0]
        normed = g.rms_norm(split, vector(f"{b}.{name}"), c.eps, f"{b}.{name}")
        out.append(g.op("Reshape", [normed, whole])[0])
    return [*out, v]
