"""A llama layer range ``[a, b)`` as one ONNX Runtime graph, on the GGUF's own blocks.

The numpy model (:mod:`hecate.llm.llama`) dequantises every weight to float32 and reads
538 MB per token for SmolLM2; this stage keeps the file's blocks (84 MB for its Q4_1) and
runs them with ``MatMulNBits`` (:mod:`hecate.llm.quant` says how each type maps, exactly).
One graph holds the range: RMSNorm fused with the residual add
(``SkipSimplifiedLayerNormalization``), the fused QKV product, ``GroupQueryAttention``
with RoPE on adjacent pairs (as llama.cpp and the numpy model rotate), the gated MLP,
and on the last stage the final norm and the head on each row's last position.

KV cache: one buffer per layer, ``[slots, kv_heads, capacity, head_dim]``, mapped in
base pages that the kernel backs only as positions are written (:func:`kv_buffer`), so
a session's cache grows without a copy and costs what it holds; a freed slot's pages
go back to the kernel. A session holds a slot. A batch of decode steps (one row
each) is one run over the slots from the lowest to the highest it touches, each row
attending over its own length (``seqlens_k``); the attention reads and writes the
buffers in place (past and present bound to the same memory). A slot in that span
with no step rides along as a padding row, writing only at its next position, which its
own next step overwrites. A prefill chunk is a run of its own, one row of ``T``
positions. A run of a single position (one session's decode step) takes a padding row
beside it, so that every product runs on the same kernel whoever shares the step
(:meth:`OnnxStage._beside`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from onnx import TensorProto, helper, numpy_helper

from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import LlamaConfig, read_config
from hecate.llm.quant import Packed, pack

Array = npt.NDArray[np.float32]

#: int8 activations in MatMulNBits, as llama.cpp quantises its activations to Q8: the
#: fast path on CPUs (without it a 4-bit product is 20 times slower).
ACCURACY_LEVEL = 4
MS = "com.microsoft"
#: Spans of slots whose KV bindings are kept (a decode batch's span, each prefill's slot).
BINDINGS = 256


@dataclass
class Slot:
    """A session's place in the stage's KV buffers, and how many positions it holds."""

    index: int
    length: int = 0
    bytes_per_position: int = 0

    def nbytes(self) -> int:
        return self.length * self.bytes_per_position


class _Graph:
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


def kv_buffer(shape: tuple[int, ...]) -> Array:
    """A zeroed float32 array on anonymous memory in base pages, backed only where
    written. Not ``np.zeros``: numpy asks for transparent huge pages on large arrays,
    and with 2 MiB pages a head's first position (``capacity * head_dim * 4`` bytes
    apart from the next head's) would make a session's first step cost its whole slot
    (377 MB on SmolLM2 at 8,192 positions, measured)."""
    nbytes = max(int(np.prod(shape)) * 4, 1)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, np.float32).reshape(shape)


def release(pool: Array, index: int) -> None:
    """Give the whole pages of slot ``index`` of ``pool`` (a :func:`kv_buffer`) back to
    the kernel; they read as zeros when touched again."""
    buf: object = pool
    while isinstance(buf, np.ndarray | memoryview):  # the reshape, frombuffer's view
        buf = buf.base if isinstance(buf, np.ndarray) else buf.obj
    if not isinstance(buf, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return
    size = pool[0].nbytes
    page = mmap.PAGESIZE
    first = -(-index * size // page) * page
    end = (index + 1) * size // page * page
    if end > first:
        buf.madvise(mmap.MADV_DONTNEED, first, end - first)


def trim_heap() -> None:
    """Hand the heap's free pages back to the kernel (glibc's ``malloc_trim``): building
    a graph frees several copies of the weights (the GGUF's parsed metadata, the
    protobuf, its bytes) that the allocator would otherwise keep, about half of what a
    stage's process held once built (measured: 802 MiB, 418 after)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


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


class OnnxStage:
    """Blocks ``[layer_start, layer_end)`` of a llama GGUF; embeds on the first stage (in
    numpy: a few rows dequantised), heads on the last (in the graph)."""

    def __init__(
        self,
        path: Path,
        layer_start: int,
        layer_end: int,
        *,
        threads: int | None = None,
        slots: int = 32,
        capacity: int | None = None,
        spin: bool = True,
    ) -> None:
        """``spin``: let ONNX Runtime's threads spin between runs (the fastest alone;
        off where several stages share the cores, as on a machine running a swarm)."""
        file = GGUFFile(path)
        self.config: LlamaConfig = read_config(file)
        c = self.config
        if not 0 <= layer_start < layer_end <= c.layers:
            raise ValueError(f"layer range [{layer_start}, {layer_end}) outside 0..{c.layers}")
        self.layer_start, self.layer_end = layer_start, layer_end
        self.first = layer_start == 0
        self.last = layer_end == c.layers
        self.blocks = layer_end - layer_start
        self.capacity = min(c.context, capacity or c.context)
        tensors = file.tensors
        # The embedding's blocks copied out of the file's map, so that the map (and the
        # pages of every tensor read to build the graph) goes with ``file``.
        embd = tensors["token_embd.weight"]
        self._embd = (np.array(embd.data), embd.tensor_type) if self.first else None

        def packed(name: str) -> Packed:
            t = tensors[f"{name}.weight"]
            k, n = int(t.shape[0]), int(t.shape[1])
            return pack(t.name, GGMLQuantizationType(t.tensor_type), t.data, n, k)

        def vector(name: str, part: str = "weight") -> npt.NDArray[np.float32]:
            t = tensors[f"{name}.{part}"]
            return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)

        g = _Graph()
        d, kv = c.head_dim, c.kv_heads
        angles = np.arange(self.capacity, dtype=np.float64)[:, None] * c.inverse_frequencies()
        cos = g.const("cos", np.cos(angles).astype(np.float32))
        sin = g.const("sin", np.sin(angles).astype(np.float32))
        x, resid, pending = "x", "", ""
        inputs = [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", c.hidden]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
            helper.make_tensor_value_info("total_len", TensorProto.INT32, []),
        ]
        outputs: list[onnx.ValueInfoProto] = []
        cache_shape: list[str | int | None] = ["B", kv, self.capacity, d]
        for i in range(layer_start, layer_end):
            b = f"blk.{i}"
            for kind in ("key", "value"):
                inputs.append(
                    helper.make_tensor_value_info(
                        f"past_{kind}.{i}", TensorProto.FLOAT, cache_shape
                    )
                )
                outputs.append(
                    helper.make_tensor_value_info(
                        f"present_{kind}.{i}", TensorProto.FLOAT, cache_shape
                    )
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
            qkv = self._linear_of(
                g, h, [packed(f"{b}.attn_{n}") for n in ("q", "k", "v")], f"{b}.qkv"
            )
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
        if self.last:
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
            self._out = "logits"
        else:
            g.nodes.append(helper.make_node("Add", [pending, resid], ["hidden"]))
            outputs.insert(
                0, helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "S", c.hidden])
            )
            self._out = "hidden"
        graph = helper.make_graph(
            g.nodes, f"llama[{layer_start},{layer_end})", inputs, outputs, g.inits
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
        )
        model.ir_version = 10
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or os.cpu_count() or 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if not spin:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        del model, graph, g
        # One slot more than sessions can hold: the padding row of a row run alone
        # (:meth:`_beside`), never a session's.
        shape = (slots + 1, kv, self.capacity, d)
        self._k = [kv_buffer(shape) for _ in range(self.blocks)]
        self._v = [kv_buffer(shape) for _ in range(self.blocks)]
        # By index: the slot's holder; the last, the spare, is never a session's.
        self._held: list[Slot | None] = [None] * (slots + 1)
        self._bytes_per_position = 2 * self.blocks * kv * d * 4
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}  # by span, LRU last
        #: Whether a row run alone takes a padding row beside it (:meth:`_beside`).
        self.pads_alone: bool = self._one_row_differs()
        trim_heap()

    @staticmethod
    def _linear_of(g: _Graph, x: str, parts: list[Packed], stem: str) -> str:
        fused = _fuse(parts)
        if fused is not None:
            return g.linear(x, fused, stem)
        outs = [g.linear(x, p, f"{stem}.{j}") for j, p in enumerate(parts)]
        return g.op("Concat", outs, axis=-1)[0]

    @property
    def block_count(self) -> int:
        return self.blocks

    def logits_of(self, outs: list[Array]) -> Array:
        """The last-position logits [B, vocab] of what ``forward_batch`` returned."""
        return np.concatenate(outs)

    # sessions' slots -------------------------------------------------------------

    def new_cache(self) -> Slot:
        # The lowest free index: decode runs then span fewer padding rows.
        sessions = range(len(self._held) - 1)  # not the spare
        index = next((i for i in sessions if self._held[i] is None), None)
        if index is None:
            raise MemoryError("every KV slot of this stage is taken")
        slot = self._held[index] = Slot(index, 0, self._bytes_per_position)
        return slot

    def free(self, slot: Slot) -> None:
        if self._held[slot.index] is slot:
            self._held[slot.index] = None
            for pool in (*self._k, *self._v):
                release(pool, slot.index)

    # the model -------------------------------------------------------------------

    def embed(self, tokens: list[int]) -> Array:
        assert self._embd is not None, "only the first stage embeds"
        blocks, kind = self._embd
        rows = blocks[np.asarray(tokens, dtype=np.int64)]
        out: Array = np.asarray(dequantize(rows, kind), dtype=np.float32)
        return out.reshape(len(tokens), self.config.hidden)

    def forward_batch(self, xs: list[Array], caches: list[Slot]) -> list[Array]:
        """Run the range for several sessions (each once): ``xs[j]`` [T_j, hidden] are the
        next positions of ``caches[j]``. Returns the output hidden rows [T_j, hidden], or
        on the last stage the logits of each session's last position [1, vocab]."""
        out: list[Array | None] = [None] * len(xs)
        decode = [j for j, x in enumerate(xs) if x.shape[0] == 1]
        for j, x in enumerate(xs):
            if x.shape[0] > 1:
                out[j] = self._run([x], [caches[j]])[0]
        if decode:
            for j, y in zip(
                decode, self._run([xs[j] for j in decode], [caches[j] for j in decode]), strict=True
            ):
                out[j] = y
        return [y for y in out if y is not None]

    def _binding(self, lo: int, hi: int) -> ort.IOBinding:
        """A binding of the KV buffers of slots ``[lo, hi)`` (past and present the same
        memory), made once per span: binding 4 buffers a block costs a node about a
        tenth of a decode step when done on every step (measured on SmolLM2)."""
        io = self._bindings.pop((lo, hi), None)
        if io is None:
            io = self.session.io_binding()
            for n, i in enumerate(range(self.layer_start, self.layer_end)):
                for kind, pool in (("key", self._k[n]), ("value", self._v[n])):
                    value = ort.OrtValue.ortvalue_from_numpy(pool[lo:hi])
                    io.bind_ortvalue_input(f"past_{kind}.{i}", value)
                    io.bind_ortvalue_output(f"present_{kind}.{i}", value)
            while len(self._bindings) >= BINDINGS:
                self._bindings.pop(next(iter(self._bindings)))  # the least recently used
        self._bindings[(lo, hi)] = io
        return io

    def _one_row_differs(self) -> bool:
        """Whether this machine's kernels compute a row run alone otherwise than the same
        row beside another (see :meth:`_beside`): a made-up position through the range
        both ways, compared bit for bit. Where they agree, a row alone runs alone, at the
        one-row kernel's speed (on AMD Zen 2, which needs the padding row, a decode step
        took 1.17-1.26x as long beside it as alone, whole model or a 10-block range)."""
        row = np.random.default_rng(0).standard_normal((1, self.config.hidden), np.float32)
        outs = []
        for pad in (False, True):
            self.pads_alone = pad  # what _run reads
            slot = self.new_cache()
            try:
                outs.append(self._run([row], [slot])[0])
            finally:
                self.free(slot)
        return not np.array_equal(outs[0], outs[1])

    def _beside(self, index: int) -> tuple[int, int]:
        """A span of two slots around ``index``, for a run of one row alone.

        A product of one row takes MLAS's one-row kernel, which on some CPUs (AVX2
        without AVX-512: AMD Zen 2, measured) sums a block's int8 products in another
        order than its kernel for several rows; the next block's activations, quantised
        to int8 again, turn that last-bit difference into a different token within a few
        steps (on SmolLM2, 9 of 16 prompts' greedy texts within 16 tokens). So a
        session's tokens would depend on whether another session shared its step (and a
        replay, whose prompt runs as several rows, on whether it had run alone). A
        padding row beside it (zeros, as any unused slot in a span) keeps every product
        on the kernel for several rows, whose rows are each computed alike whatever the
        others are. The neighbour is a free slot where there is one (the spare slot
        after the last is always free); a held one gets the padding row's key and value
        at its next position, which its own next step overwrites (as a held slot inside
        any span does), so it needs room there."""
        held = self._held
        for other in (index + 1, index - 1):
            if 0 <= other < len(held) and held[other] is None:
                return min(index, other), max(index, other) + 1
        for other in (index + 1, index - 1):
            holder = held[other] if 0 <= other < len(held) else None
            if holder is not None and holder.length < self.capacity:
                return min(index, other), max(index, other) + 1
        return index, index + 1  # no room beside it: the one-row kernel

    def _run(self, xs: list[Array], caches: list[Slot]) -> list[Array]:
        c = self.config
        rows = xs[0].shape[0]
        for cache in caches:
            if cache.length + rows > self.capacity:
                raise ValueError(
                    f"a session of {cache.length + rows} positions is past this stage's "
                    f"{self.capacity}"
                )
        lo = min(s.index for s in caches)
        hi = max(s.index for s in caches) + 1
        if (hi - lo) * rows == 1 and self.pads_alone:
            lo, hi = self._beside(lo)
        x = np.zeros((hi - lo, rows, c.hidden), np.float32)
        for cache, row in zip(caches, xs, strict=True):
            x[cache.index - lo] = row
        lengths = np.asarray(
            [0 if held is None else held.length for held in self._held[lo:hi]], dtype=np.int32
        )
        seqlens = lengths + np.int32(rows - 1)
        io = self._binding(lo, hi)
        io.bind_cpu_input("x", x)
        io.bind_cpu_input("seqlens_k", seqlens)
        io.bind_cpu_input("total_len", np.array(int(lengths.max()) + rows, dtype=np.int32))
        # The output straight into an array of ours: reading it back through the
        # binding would wrap every KV buffer too, on every step.
        shape = (hi - lo, c.vocab) if self.last else (hi - lo, rows, c.hidden)
        y: Array = np.empty(shape, np.float32)
        io.bind_output(self._out, "cpu", 0, np.float32, list(shape), y.ctypes.data)
        self.session.run_with_iobinding(io)
        for cache in caches:
            cache.length += rows
        if self.last:
            return [y[s.index - lo : s.index - lo + 1] for s in caches]
        return [y[s.index - lo] for s in caches]
