"""A stage's weights into memory once: its graph built in pieces, each piece's weights
handed to ONNX Runtime as they are and dropped as soon as it has packed them.

Built the plain way, a range's weights lived up to seven times over while it loaded:
the arrays repacked from the file, their protobuf, its serialized bytes, the session's
own copies and the kernels' prepacked ones (the 1B shape whole: 625 MiB of tensors,
4.72 GB peak, 2.09 GB resident). Here:

- the graph names its weights and the session takes the very arrays
  (:class:`~hecate.llm.onnx_graph.Built`, ONNX Runtime's external initializers): no
  protobuf copy, no serialized copy, no session copy;
- the session reads the arrays where they lie for as long as it lives, so a piece keeps
  them, all but ``MatMulNBits``' integers, which the kernel packs into a copy of its
  own and never reads again: those go once the session is made, when this runtime on
  this CPU is seen not to read them (:func:`left_unread`, a probe, not an assumption:
  freed while still read they would be garbage);
- the range is cut into pieces of at most :data:`PIECE_BYTES` of the file (a block at
  least), each a session of its own built in turn, so that what a piece holds twice
  while it loads (the repacked arrays beside the packed kernels) is one piece's, not
  the range's; a piece's arrays go once its session is made, and the kernels' packed
  copies are what stays;
- the file's pages read for a piece are handed back (:meth:`GGUFFile.drop_pages`), so
  the mapped file does not count twice either.

The pieces run one after the other, the hidden state passed along: a range cut in
pieces computes the very numbers of the range in one piece, as stages cut anywhere do
(:func:`hecate.llm.onnx_graph.build` normalises a later piece's input with the kernel
the whole graph would use there).

What stays is the runtime's packed form: for a 4-bit block of 32, its 4 bits, a float32
scale and a float32 block sum a weight group (6 bits a weight), and the scales and zero
points it keeps as given besides; for Q4_K's 4.5 bits a weight, about 1.6 times the
file's bytes (measured by ``hecate bench memory``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import LlamaConfig
from hecate.llm.kv_pool import KV_TYPE, KvType
from hecate.llm.onnx_graph import ACCURACY_LEVEL, MS, ROLES, build
from hecate.llm.sessions import kv_bytes_per_position
from hecate.model.footprint import Footprint

#: the file bytes of blocks a piece holds at most (a block at least): what loading
#: holds twice at its peak, beside the pieces already loaded
PIECE_BYTES = 64 << 20
#: What this engine holds per byte of the file once a range is built, and what
#: building its largest piece adds for a while, per byte of that piece: measured on
#: Q4_K files of the 1B and 8B shapes (``hecate bench memory``: 1.97 to 2.07 held,
#: 2.95 to 3.3 more while loading), rounded up. A node plans its memory with them
#: (:func:`footprint`); the bench checks them against what it measures.
HELD_PER_FILE_BYTE = 2.1
LOADING_PER_FILE_BYTE = 3.5


@dataclass
class Piece:
    """Blocks ``[layer_start, layer_end)`` of a stage, as one session."""

    session: ort.InferenceSession
    layer_start: int
    layer_end: int
    out: str
    #: the arrays the session reads where they lie: they live as long as it does
    keep: list[npt.NDArray[Any]] = field(default_factory=list)


def block_bytes(file: GGUFFile, layer: int) -> int:
    """The file's bytes of block ``layer``'s tensors."""
    prefix = f"blk.{layer}."
    return sum(t.data.nbytes for name, t in file.tensors.items() if name.startswith(prefix))


def end_bytes(file: GGUFFile, c: LlamaConfig) -> tuple[int, int]:
    """The file's bytes the first stage holds besides its blocks (the embedding) and the
    last (the final norm and the head: the embedding again where it is tied)."""
    tensors = file.tensors
    embedding = tensors["token_embd.weight"].data.nbytes
    head = tensors["token_embd.weight" if c.tied_head else "output.weight"].data.nbytes
    return embedding, head + tensors["output_norm.weight"].data.nbytes


def stage_bytes(file: GGUFFile, c: LlamaConfig, layer_start: int, layer_end: int) -> int:
    """The file's bytes a stage of blocks ``[layer_start, layer_end)`` reads."""
    first, last = end_bytes(file, c)
    blocks = sum(block_bytes(file, i) for i in range(layer_start, layer_end))
    return blocks + (first if layer_start == 0 else 0) + (last if layer_end == c.layers else 0)


def footprint(file: GGUFFile, c: LlamaConfig, kv_positions: int, kv_itemsize: int) -> Footprint:
    """What ranges of the file's model cost this engine (:class:`Footprint`), a layer's
    KV budget being ``kv_positions`` positions of ``kv_itemsize``-byte numbers."""
    blocks = [block_bytes(file, i) for i in range(c.layers)]
    head = end_bytes(file, c)[1]
    pieces = [sum(blocks[a:b]) for a, b in cuts(blocks)] + [blocks[-1] + head]
    return Footprint(
        blocks=tuple(int(b * HELD_PER_FILE_BYTE) for b in blocks),
        head=int(head * HELD_PER_FILE_BYTE),
        kv_per_layer=kv_positions * kv_bytes_per_position(c, 1, kv_itemsize),
        loading=int(max(pieces) * LOADING_PER_FILE_BYTE),
    )


def cuts(sizes: list[int], budget: int = PIECE_BYTES) -> list[tuple[int, int]]:
    """Consecutive runs of ``sizes`` (indices from 0), each summing to at most
    ``budget`` unless it is one item: the pieces a range is loaded in."""
    out: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > budget:
            out.append((start, i))
            start, total = i, 0
        total += size
    if sizes:
        out.append((start, len(sizes)))
    return out


def load(
    file: GGUFFile,
    c: LlamaConfig,
    layer_start: int,
    layer_end: int,
    capacity: int,
    options: Callable[[bool], ort.SessionOptions],
    kv_type: KvType = KV_TYPE,
) -> list[Piece]:
    """The stage's pieces, loaded one after another (``options`` makes each session's
    options, told whether there are several pieces: they hold the arrays handed over
    until the session is made), their KV caches kept in ``kv_type``."""
    sizes = [block_bytes(file, i) for i in range(layer_start, layer_end)]
    if layer_end == c.layers:  # the head loads with the last block
        sizes[-1] += end_bytes(file, c)[1]
    pieces = []
    ranges = cuts(sizes, PIECE_BYTES)
    for lo, hi in ranges:
        a, b = layer_start + lo, layer_start + hi
        built = build(file, c, a, b, capacity, kv_type)
        opts = options(len(ranges) > 1)
        names = list(built.weights)
        values = [ort.OrtValue.ortvalue_from_numpy(built.weights[n]) for n in names]
        opts.add_external_initializers(names, values)
        session = ort.InferenceSession(
            built.model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        unread = {
            name for name, (bits, block, role) in built.packed.items()
            if role in left_unread(bits, block)
        }  # fmt: skip
        keep = [array for name, array in built.weights.items() if name not in unread]
        pieces.append(Piece(session, a, b, built.out, keep))
        del built, opts, values, keep
        gc.collect()
        file.drop_pages()
        trim_heap()
    return pieces


#: the rows a probe multiplies: a decode step alone and beside others, a prefill chunk
PROBE_ROWS = (1, 2, 7, 64, 300)


@functools.cache
def left_unread(bits: int, block: int) -> frozenset[str]:
    """Which weights of a product, handed over as external initializers, this runtime
    on this CPU packs into a copy of its own and never reads again: of a
    ``MatMulNBits`` of ``bits`` and ``block``, which of :data:`ROLES` (its integers,
    scales, zero points); with ``bits`` 0, whether a float ``MatMul``'s weight
    (``dense``). A product is made on arrays, the arrays are overwritten, and the
    product must not change, for every row count of :data:`PROBE_ROWS`. First all are
    tried, then the integers alone; what a kernel still reads stays alive with the
    session.

    (On x86, ONNX Runtime packs scales and zero points into the integers' buffer yet
    keeps the tensors it was given: 1.25 bits a weight of a 4-bit block of 32 that
    nothing reads once the session is made.)"""
    rng = np.random.default_rng(0)
    given: dict[str, npt.NDArray[Any]]
    if bits == 0:
        k, n = 64, 256  # a residual's shape: a hidden of 2,048 in blocks of 32
        given = {"dense": rng.standard_normal((k, n)).astype(np.float32)}
        node = helper.make_node("MatMul", ["x", "dense"], ["y"])
        tries: tuple[tuple[str, ...], ...] = (("dense",),)
    else:
        k, n = 4 * block, 16
        given = {
            "q": rng.integers(0, 256, (n, k // block, block * bits // 8), dtype=np.uint8),
            "s": rng.uniform(0.5, 1.0, n * k // block).astype(np.float32),
            "z": rng.integers(0, 256, n * k // block * bits // 8, dtype=np.uint8),
        }
        node = helper.make_node(
            "MatMulNBits", ["x", *ROLES], ["y"], domain=MS, K=k, N=n, bits=bits,
            block_size=block, accuracy_level=ACCURACY_LEVEL,
        )  # fmt: skip
        tries = (ROLES, ("q",))
    model = _probe_model(node, given, k, n)
    xs = [rng.standard_normal((m, k)).astype(np.float32) for m in PROBE_ROWS]
    for roles in tries:
        arrays = {name: array.copy() for name, array in given.items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.add_external_initializers(
            list(arrays), [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays.values()]
        )
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        before = [session.run(None, {"x": x})[0] for x in xs]
        for role in roles:
            arrays[role][...] = 3.0 if arrays[role].dtype == np.float32 else 0x11
        after = [session.run(None, {"x": x})[0] for x in xs]
        if all(np.array_equal(a, b) for a, b in zip(before, after, strict=True)):
            return frozenset(roles)
    return frozenset()


def _probe_model(node: onnx.NodeProto, given: dict[str, npt.NDArray[Any]], k: int, n: int) -> bytes:
    inits = []
    for name, array in given.items():
        proto = TensorProto(
            name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape
        )
        proto.data_location = TensorProto.EXTERNAL
        proto.external_data.add(key="location", value="handed-over")
        inits.append(proto)
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 10
    return model.SerializeToString()


def trim_heap() -> None:
    """Hand the heap's free pages back to the kernel (glibc's ``malloc_trim``): the
    arrays of a piece just loaded are freed, and the allocator would otherwise keep
    their pages for later."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass
