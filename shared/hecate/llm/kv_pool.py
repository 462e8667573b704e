"""A stage's KV cache: one buffer per layer and kind, ``[slots, kv_heads, capacity,
head_dim]``, on anonymous memory the kernel backs only where positions are written, so a
session's cache costs what it holds and a freed slot's pages go back at once.
"""

from __future__ import annotations

import mmap
import platform
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

KvArray = npt.NDArray[Any]
#: the number types a KV cache may be kept in
KvType = type[np.float16] | type[np.float32]
#: what the engine keeps its KV cache in unless a stage asks otherwise: float16, as
#: llama.cpp keeps it (half float32's bytes)
KV_TYPE: KvType = np.float16


@dataclass
class Slot:
    """A session's place in the stage's KV buffers, and how many positions it holds."""

    index: int
    length: int = 0
    bytes_per_position: int = 0

    def nbytes(self) -> int:
        return self.length * self.bytes_per_position


#: Linux's MAP_NORESERVE (0x4000 on x86 and arm; Python's mmap names it from 3.13): the
#: KV buffers reserve a session's whole context but use only what is written, so they
#: are not charged against the commit limit up front. Charged, a stage's 60 buffers
#: (24 GB of address space for 64 sessions of 8,192 positions) merge into one mapping
#: the kernel refuses to copy at fork once it exceeds the machine's memory: the node
#: could then start no process at all (measured: ENOMEM from subprocess).
MAP_NORESERVE: int = getattr(
    mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" and platform.machine() in
    ("x86_64", "aarch64", "arm64", "armv7l") else 0
)  # fmt: skip


def kv_buffer(shape: tuple[int, ...], dtype: KvType) -> KvArray:
    """A zeroed array on anonymous memory in base pages, backed only where
    written. Not ``np.zeros``: numpy asks for transparent huge pages on large arrays,
    and with 2 MiB pages a head's first position (``capacity * head_dim`` numbers
    apart from the next head's) would make a session's first step cost its whole slot
    (377 MB on SmolLM2 at 8,192 positions, measured)."""
    nbytes = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
    buf = mmap.mmap(-1, nbytes, flags=flags)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype).reshape(shape)


def release(pool: KvArray, index: int) -> None:
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
