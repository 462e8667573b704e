"""A GGUF file's header read in one pass, its tensors left on disk (memory-mapped).

``gguf.GGUFReader`` builds a numpy view for every part of every field: SmolLM2's
vocabulary and merges (98,000 strings) cost it about 3.3 s of pure Python and 157 MB
before a node can build its graph, and every node of a swarm paid it at start. Here the
header is walked once with ``struct``: scalars are decoded, numeric arrays are numpy
views of the mapped file, and string arrays are decoded only when asked for (a stage
never asks for the vocabulary). Tensor data are views of the same map, so a stage
touches only the pages of its own layers, and nodes on one machine share them.

The layout (GGUF v2 and v3, little-endian)::

    "GGUF" u32 version, u64 tensor count, u64 metadata count
    metadata: string key, u32 type, value          (array: u32 type, u64 count, items)
    tensors:  string name, u32 dims, u64 per dim, u32 type, u64 offset in the data
    data:     from the header's end rounded up to ``general.alignment`` (default 32)
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
#: the largest ``general.alignment`` obeyed (llama.cpp's writers use 32; this is a
#: megabyte): one larger is a damaged header, refused rather than followed
MAX_ALIGNMENT = 1 << 20
#: arrays of arrays nested deeper than this are refused: the format allows nesting, the
#: metadata a model needs has none, and a deep nest would exhaust the reader's stack
MAX_NESTING = 8
#: a tensor's dimensions at most (ggml's GGML_MAX_DIMS, which llama.cpp enforces too)
MAX_DIMS = 4

#: metadata value types: scalar struct formats (``STRING`` 8 and ``ARRAY`` 9 apart)
SCALARS: dict[int, str] = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}  # fmt: skip
STRING, ARRAY = 8, 9
#: numpy dtypes of tensors stored unquantised
PLAIN: dict[GGMLQuantizationType, type[np.generic]] = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class BadGGUF(ValueError):
    """A file that is not a GGUF this reader understands; the message says where."""


@dataclass(frozen=True)
class Tensor:
    """One tensor: ``shape`` in GGUF's order (inputs first), ``data`` as ``gguf``'s
    reader gives it: plain types as their numbers (dimensions reversed), quantised ones
    as rows of block bytes ``[..., bytes of a row]``."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    data: npt.NDArray[Any]


class _Strings:
    """A string array not decoded yet: where it starts and how many strings it holds
    (their lengths were checked against the file when the header was read)."""

    def __init__(self, path: Path, key: str, buf: memoryview, start: int, count: int) -> None:
        self.path, self.key = path, key
        self.buf, self.start, self.count = buf, start, count

    def decode(self) -> list[str]:
        """Every string, or :class:`BadGGUF` naming the first that is not UTF-8.

        Not decoded with ``errors="replace"``, though llama.cpp keeps a token's raw bytes
        and never decodes them: every vocabulary this engine rebuilds is text (byte-level
        BPE spells bytes as printable characters, SentencePiece as ``<0x41>``), so a token
        that is not UTF-8 is a damaged file, and replacing its bytes would give two
        tokens the same text, and one of them no id."""
        out, at = [], self.start
        for i in range(self.count):
            (n,) = struct.unpack_from("<Q", self.buf, at)
            try:
                out.append(bytes(self.buf[at + 8 : at + 8 + n]).decode("utf-8"))
            except UnicodeDecodeError as e:
                raise BadGGUF(
                    f"{self.path}: item {i} of {self.key!r} is not UTF-8 ({e.reason} at "
                    f"byte {e.start})"
                ) from None
            at += 8 + n
        return out


class Metadata(Mapping[str, Any]):
    """The header's key-values; string arrays decoded on first access."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        if isinstance(value, _Strings):
            value = self._values[key] = value.decode()
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class GGUFFile:
    """The header of ``path``, and its tensors as views of the mapped file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as e:  # an empty file cannot be mapped
                raise BadGGUF(f"{self.path}: not a GGUF file (empty)") from e
        self._buf = memoryview(self._map)
        try:
            self._parse()
        except struct.error as e:
            raise BadGGUF(f"{self.path}: truncated header ({e})") from e
        except UnicodeDecodeError as e:
            raise BadGGUF(f"{self.path}: a name in its header is not UTF-8 ({e})") from e

    def _parse(self) -> None:
        buf = self._buf
        if bytes(buf[:4]) != MAGIC:
            raise BadGGUF(f"{self.path}: not a GGUF file (starts {bytes(buf[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in VERSIONS:
            raise BadGGUF(f"{self.path}: GGUF version {version} (this reader knows 2 and 3)")
        self.version = version
        at = 24
        values: dict[str, Any] = {}
        for _ in range(n_kv):  # each takes bytes: a count past them stops at the end
            key, at = self._string(at)
            if key in values:
                raise BadGGUF(f"{self.path}: metadata {key!r} given twice")
            (kind,) = struct.unpack_from("<I", buf, at)
            values[key], at = self._value(kind, at + 4, key)
        self.metadata = Metadata(values)
        infos = []
        names: set[str] = set()
        for _ in range(n_tensors):
            name, at = self._string(at)
            if name in names:
                raise BadGGUF(f"{self.path}: tensor {name!r} given twice")
            names.add(name)
            (dims,) = struct.unpack_from("<I", buf, at)
            if dims > MAX_DIMS:
                raise BadGGUF(f"{self.path}: tensor {name!r} has {dims} dimensions (at most 4)")
            shape = struct.unpack_from(f"<{dims}Q", buf, at + 4)
            kind, offset = struct.unpack_from("<IQ", buf, at + 4 + 8 * dims)
            at += 4 + 8 * dims + 12
            try:
                infos.append(
                    (name, tuple(int(s) for s in shape), GGMLQuantizationType(kind), offset)
                )
            except ValueError as e:
                raise BadGGUF(f"{self.path}: tensor {name!r} has unknown type {kind}") from e
        alignment = self._alignment(values.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-at // alignment) * alignment
        self.tensors: dict[str, Tensor] = {}
        for name, shape, kind, offset in infos:
            self.tensors[name] = self._tensor(name, shape, kind, start + offset)

    def _alignment(self, value: Any) -> int:
        """``general.alignment``: a whole power of two, as llama.cpp requires, and not
        beyond :data:`MAX_ALIGNMENT`."""
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or value <= 0
            or value & (value - 1)
            or value > MAX_ALIGNMENT
        ):
            raise BadGGUF(
                f"{self.path}: general.alignment {value!r} is not a power of two from 1 to "
                f"{MAX_ALIGNMENT}"
            )
        return value

    def _string(self, at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._buf, at)
        end = at + 8 + n
        if end > len(self._buf):
            raise struct.error(f"a string of {n} bytes at {at} runs past the end")
        return bytes(self._buf[at + 8 : end]).decode("utf-8"), end

    def _value(self, kind: int, at: int, key: str, depth: int = 0) -> tuple[Any, int]:
        if kind in SCALARS:
            fmt = "<" + SCALARS[kind]
            return struct.unpack_from(fmt, self._buf, at)[0], at + struct.calcsize(fmt)
        if kind == STRING:
            return self._string(at)
        if kind != ARRAY:
            raise BadGGUF(f"{self.path}: metadata {key!r} has unknown type {kind}")
        if depth >= MAX_NESTING:
            raise BadGGUF(f"{self.path}: metadata {key!r} nests arrays deeper than {MAX_NESTING}")
        item, count = struct.unpack_from("<IQ", self._buf, at)
        if item not in SCALARS and item not in (STRING, ARRAY):
            raise BadGGUF(f"{self.path}: metadata {key!r} is an array of unknown type {item}")
        at += 12
        left = len(self._buf) - at
        if item in SCALARS:
            dtype = np.dtype(SCALARS[item]).newbyteorder("<")
            end = at + count * dtype.itemsize
            if end > len(self._buf):
                raise struct.error(f"array {key!r} runs past the end")
            return np.frombuffer(self._buf, dtype, count, at), end
        # Every item takes bytes (a string 8 at least, an array 12): a count the rest of
        # the file cannot hold is refused here, before a loop of that many turns.
        smallest = 8 if item == STRING else 12
        if count * smallest > left:
            raise struct.error(f"array {key!r} of {count} items runs past the end")
        if item == STRING:
            strings = _Strings(self.path, key, self._buf, at, count)
            for _ in range(count):  # only the lengths, to find the end
                (n,) = struct.unpack_from("<Q", self._buf, at)
                at += 8 + n
                if at > len(self._buf):
                    raise struct.error(f"a string of array {key!r} runs past the end")
            return strings, at
        items = []
        for _ in range(count):  # arrays of arrays: rare, read as they are
            value, at = self._value(item, at, key, depth + 1)
            items.append(value)
        return items, at

    def _tensor(
        self, name: str, shape: tuple[int, ...], kind: GGMLQuantizationType, at: int
    ) -> Tensor:
        count = math.prod(shape)  # Python's integers: a crafted shape cannot overflow them
        dims = tuple(reversed(shape))
        if kind in PLAIN:
            dtype = np.dtype(PLAIN[kind])
            nbytes = count * dtype.itemsize
            view_shape = dims
        else:
            if kind not in GGML_QUANT_SIZES:
                raise BadGGUF(f"{self.path}: tensor {name!r} of type {kind.name}: no block size")
            block, block_bytes = GGML_QUANT_SIZES[kind]
            if not shape or shape[0] % block:
                raise BadGGUF(
                    f"{self.path}: tensor {name!r}: {shape[0] if shape else 0} not in {block}s"
                )
            dtype = np.dtype(np.uint8)
            nbytes = count // block * block_bytes
            view_shape = (*dims[:-1], shape[0] // block * block_bytes)
        if at + nbytes > len(self._buf):
            raise BadGGUF(f"{self.path}: tensor {name!r} runs past the end of the file")
        data = np.frombuffer(self._buf, dtype, nbytes // dtype.itemsize, at).reshape(view_shape)
        return Tensor(name, shape, kind, data)

    def drop_pages(self) -> None:
        """Hand back the pages of the file read so far: they leave this process's
        resident memory (the kernel's page cache keeps them while it has room), and
        views of the file read again from it when touched."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def field(self, key: str) -> Any:
        """A metadata value; a missing key is an error naming it and the file."""
        try:
            return self.metadata[key]
        except KeyError:
            raise BadGGUF(f"{self.path}: no {key!r} in its metadata") from None
