"""A llama layer range ``[a, b)`` as one ONNX Runtime graph, on the GGUF's own blocks.

The numpy model (:mod:`hecate.llm.llama`) dequantises every weight to float32 and reads
538 MB per token for SmolLM2; this stage keeps the file's blocks (84 MB for its Q4_1) and
runs them with ``MatMulNBits`` (:mod:`hecate.llm.quant` says how each type maps, exactly).
One graph holds the range: RMSNorm fused with the residual add
(``SkipSimplifiedLayerNormalization``), the fused QKV product, ``GroupQueryAttention``
with RoPE on adjacent pairs (as llama.cpp and the numpy model rotate), the gated MLP
(gate and up one product),
and on the last stage the final norm and the head on each row's last position.

KV cache: in float16 by default, as llama.cpp keeps it (half float32's bytes: 128 KiB a
position on an 8B shape). The attention then runs in float16
(:func:`hecate.llm.onnx_graph.build`), which ONNX Runtime's CPU kernel computes more
slowly than float32 where the CPU has no float16 arithmetic (an AVX-512 Xeon, 2 threads,
decode: SmolLM2 71 tokens/s against 95, the 1B shape 17.3 against 18.5). One buffer per
layer, ``[slots, kv_heads, capacity, head_dim]``, mapped in
base pages that the kernel backs only as positions are written (:mod:`hecate.llm.kv_pool`), so
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

import os
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from gguf.quants import dequantize

from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import LlamaConfig, read_config
from hecate.llm.kv_pool import KV_TYPE, KvType, Slot, kv_buffer, release
from hecate.llm.onnx_load import Piece, load, trim_heap
from hecate.llm.sessions import kv_bytes_per_position

Array = npt.NDArray[np.float32]
#: How a stage's threads wait between runs (:class:`OnnxStage`'s ``spin``).
Spin = bool | Literal["in runs"]

#: Spans of slots whose KV bindings are kept (a decode batch's span, each prefill's slot).
BINDINGS = 256


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
        spin: Spin = True,
        kv_type: KvType = KV_TYPE,
    ) -> None:
        """``kv_type``: the numbers the KV cache keeps (float16, as llama.cpp; float32
        only where :func:`~hecate.llm.onnx_load.load` builds the graph for it).
        ``spin``: let ONNX Runtime's threads spin between runs (the fastest alone;
        off where several stages share the cores, as on a machine running a swarm);
        ``"in runs"``: spin within a run and stop as it ends (faster than not spinning
        while the stage's run has the cores to itself, slower when stages compute at
        once; measured by ``hecate bench ring``)."""
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
        #: the numbers the KV cache keeps, and their bytes each
        self.kv_type: KvType = kv_type
        self.kv_itemsize: int = np.dtype(kv_type).itemsize
        # The embedding stays in the mapped file: a prompt's rows are read as needed,
        # and the pages of rows never asked for are never this process's.
        embd = file.tensors["token_embd.weight"]
        self._embd = (embd.data, embd.tensor_type) if self.first else None

        def options(several: bool) -> ort.SessionOptions:
            o = ort.SessionOptions()
            o.intra_op_num_threads = threads or os.cpu_count() or 1
            o.inter_op_num_threads = 1
            o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            if not spin:
                o.add_session_config_entry("session.intra_op.allow_spinning", "0")
            elif spin == "in runs" or several:
                # Pieces run one after another, each with threads of its own: one
                # spinning on would take the cores from the next (the 1B shape whole in
                # 16 pieces: 3.5 tokens/s, 17.9 stopping as each run ends, 20.3 in one
                # piece spinning; ``hecate bench memory``'s machine).
                o.add_session_config_entry("session.force_spinning_stop", "1")
            return o

        #: the range's sessions, run one after the other (:mod:`hecate.llm.onnx_load`)
        self.pieces: list[Piece] = load(
            file, c, layer_start, layer_end, self.capacity, options, kv_type
        )
        del file
        built = _kv_type_of(self.pieces)
        if built is not kv_type:
            raise ValueError(
                f"a KV cache of {np.dtype(kv_type).name} asked, the graph keeps "
                f"{np.dtype(built).name}"
            )
        # One slot more than sessions can hold: the padding row of a row run alone
        # (:meth:`_beside`), never a session's.
        d, kv = c.head_dim, c.kv_heads
        shape = (slots + 1, kv, self.capacity, d)
        self._k = [kv_buffer(shape, self.kv_type) for _ in range(self.blocks)]
        self._v = [kv_buffer(shape, self.kv_type) for _ in range(self.blocks)]
        # By index: the slot's holder; the last, the spare, is never a session's.
        self._held: list[Slot | None] = [None] * (slots + 1)
        self._bytes_per_position = kv_bytes_per_position(c, self.blocks, self.kv_itemsize)
        # by span, LRU last: a binding per piece
        self._bindings: dict[tuple[int, int], list[ort.IOBinding]] = {}
        #: For STATS: the runs, the sessions' rows they were asked, the rows their spans
        #: computed (padding rows included) and the sessions moved to pack a batch.
        self.counts: dict[str, int] = {"runs": 0, "rows": 0, "rows_computed": 0, "moves": 0}
        #: Whether a row run alone takes a padding row beside it (:meth:`_beside`).
        self.pads_alone: bool = self._one_row_differs()
        self.counts = dict.fromkeys(self.counts, 0)  # serving's, not the probe's
        trim_heap()

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

    def copy_prefix(self, source: Slot, slot: Slot, length: int) -> None:
        """``slot`` (new) starts with ``source``'s first ``length`` positions."""
        for pool in (*self._k, *self._v):
            pool[slot.index, :, :length] = pool[source.index, :, :length]
        slot.length = length

    # the model -------------------------------------------------------------------

    def embed(self, tokens: list[int]) -> Array:
        assert self._embd is not None, "only the first stage embeds"
        blocks, kind = self._embd
        rows = blocks[np.asarray(tokens, dtype=np.int64)]
        out: Array = np.asarray(dequantize(rows, kind), dtype=np.float32)
        if self.config.embed_scale != 1.0:  # gemma3's √hidden, in float32 as llama.cpp's
            out *= np.float32(self.config.embed_scale)
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

    def _binding(self, lo: int, hi: int) -> list[ort.IOBinding]:
        """Bindings (a piece's each) of the KV buffers of slots ``[lo, hi)`` (past and
        present the same memory), made once per span: binding 4 buffers a block costs
        a node about a tenth of a decode step when done on every step (measured on
        SmolLM2)."""
        ios = self._bindings.pop((lo, hi), None)
        if ios is None:
            ios = []
            for piece in self.pieces:
                io = piece.session.io_binding()
                for i in range(piece.layer_start, piece.layer_end):
                    n = i - self.layer_start
                    for kind, pool in (("key", self._k[n]), ("value", self._v[n])):
                        value = ort.OrtValue.ortvalue_from_numpy(pool[lo:hi])
                        io.bind_ortvalue_input(f"past_{kind}.{i}", value)
                        io.bind_ortvalue_output(f"present_{kind}.{i}", value)
                ios.append(io)
            while len(self._bindings) >= BINDINGS:
                self._bindings.pop(next(iter(self._bindings)))  # the least recently used
        self._bindings[(lo, hi)] = ios
        return ios

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

    def _pack(self, caches: list[Slot]) -> None:
        """Move a batch's sessions next to each other when other slots lie between them.

        A run computes every row of the span of slots it binds, a session's or not: two
        groups of sessions that take turns on a stage (as a loaded pipeline's do), in
        slots taken one after another, each ran over both groups' rows, and cached
        prefixes kept between them widen the span too (4 sessions over 7 slots took the
        time of 7, on a 10-block range; 16 users through `make run`'s swarm computed
        1.45 rows a session). So the sessions move, by copying the positions they hold,
        into the free window of as many slots that holds most of them already. A group
        that keeps together moves once; the numbers are the same, row for row."""
        n = len(caches)
        mine = {c.index for c in caches}
        if max(mine) - min(mine) < n:
            return
        held, best, start_at = self._held, -1, 0
        for start in range(len(held) - n):  # not the spare, the last
            window = range(start, start + n)
            if all(held[i] is None or i in mine for i in window):
                inside = sum(i in mine for i in window)
                if inside > best:
                    best, start_at = inside, start
        if best < 0:
            return  # no such window: the span stays as it is
        window = range(start_at, start_at + n)
        free = [i for i in window if i not in mine]
        for cache in caches:
            if cache.index not in window:
                self._move(cache, free.pop())

    def _move(self, slot: Slot, index: int) -> None:
        """``slot`` to the free slot ``index``: its positions copied, its old pages freed."""
        old, n = slot.index, slot.length
        for pool in (*self._k, *self._v):
            pool[index, :, :n] = pool[old, :, :n]
            release(pool, old)
        self._held[index], self._held[old] = slot, None
        slot.index = index
        self.counts["moves"] += 1

    def _run(self, xs: list[Array], caches: list[Slot]) -> list[Array]:
        c = self.config
        rows = xs[0].shape[0]
        for cache in caches:
            if cache.length + rows > self.capacity:
                raise ValueError(
                    f"a session of {cache.length + rows} positions is past this stage's "
                    f"{self.capacity}"
                )
        if len(caches) > 1:
            self._pack(caches)
        lo = min(s.index for s in caches)
        hi = max(s.index for s in caches) + 1
        if (hi - lo) * rows == 1 and self.pads_alone:
            lo, hi = self._beside(lo)
        x = np.zeros((hi - lo, rows, c.hidden), np.float32)
        counts = self.counts
        counts["runs"] += 1
        counts["rows"] += len(caches) * rows
        counts["rows_computed"] += (hi - lo) * rows
        for cache, row in zip(caches, xs, strict=True):
            x[cache.index - lo] = row
        lengths = np.asarray(
            [0 if held is None else held.length for held in self._held[lo:hi]], dtype=np.int32
        )
        seqlens = lengths + np.int32(rows - 1)
        total = np.array(int(lengths.max()) + rows, dtype=np.int32)
        for piece, io in zip(self.pieces, self._binding(lo, hi), strict=True):
            io.bind_cpu_input("x", x)
            io.bind_cpu_input("seqlens_k", seqlens)
            io.bind_cpu_input("total_len", total)
            # The output straight into an array of ours: reading it back through the
            # binding would wrap every KV buffer too, on every step.
            logits = piece.out == "logits"
            shape = (hi - lo, c.vocab) if logits else (hi - lo, rows, c.hidden)
            y: Array = np.empty(shape, np.float32)
            io.bind_output(piece.out, "cpu", 0, np.float32, list(shape), y.ctypes.data)
            piece.session.run_with_iobinding(io)
            x = y
        for cache in caches:
            cache.length += rows
        if self.last:
            return [y[s.index - lo : s.index - lo + 1] for s in caches]
        return [y[s.index - lo] for s in caches]


def _kv_type_of(pieces: list[Piece]) -> KvType:
    """The numbers the pieces' graphs keep their KV caches in (their first cache input's)."""
    inputs = pieces[0].session.get_inputs()
    kind = next(i.type for i in inputs if i.name.startswith("past_key."))
    types: dict[str, KvType] = {"tensor(float16)": np.float16, "tensor(float)": np.float32}
    return types[kind]
