"""What memory a node has, and what it uses: read where Linux keeps it.

A node's memory is, in this order, what the operator said (``--memory``), its cgroup's
limit (cgroup v2's ``memory.max``, v1's ``memory.limit_in_bytes``: a container's or a
systemd unit's), else what the machine had available as the node started
(``MemAvailable``). What it uses is its cgroup's charge where it has a limit there
(page cache of the mapped model included: what the limit is enforced on), else its own
resident set. The parsing is pure (text in, numbers out); :func:`read` and
:func:`in_use` read the files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hecate.core.plan import MOST_MEMORY, MemorySource

#: cgroup v1 says "no limit" with a number near 2**63 (rounded down to a page)
NO_LIMIT = 1 << 60
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``--memory``'s value: bytes, or a number with K, M, G or T (powers of 1,024;
    ``2G``, ``1.5GiB``, ``512M``), at most a petabyte. Raises ValueError naming it."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"expected a size such as 2G, 1536M or a number of bytes, got {text!r}")
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if not 0 < size <= MOST_MEMORY:
        raise ValueError(f"expected a size above 0 and at most 1 PiB, got {text!r}")
    return size


@dataclass(frozen=True, slots=True)
class Memory:
    """The memory a node may use, and where the figure comes from."""

    limit: int
    source: MemorySource


def cgroup_dir(proc_self_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """The folder of this process's memory cgroup, from ``/proc/self/cgroup``'s text:
    v1's ``N:memory:/path`` (or a line naming memory among its controllers), else
    v2's ``0::/path``."""
    unified: Path | None = None
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        if "memory" in controllers.split(","):
            return root / "memory" / path.lstrip("/")
        if controllers == "":
            unified = root / path.lstrip("/")
    return unified


def limit_of(text: str) -> int | None:
    """A cgroup limit file's value: None for no limit (v2's ``max``, v1's huge number)."""
    text = text.strip()
    if not text or text == "max":
        return None
    value = int(text)
    return None if value >= NO_LIMIT else value


def available(meminfo: str) -> int:
    """``MemAvailable`` of ``/proc/meminfo``'s text, in bytes."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise ValueError("/proc/meminfo: no MemAvailable")


def resident(status: str) -> int:
    """``VmRSS`` of ``/proc/self/status``'s text, in bytes."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_limit() -> tuple[Path, int] | None:
    """This process's memory cgroup folder and its limit, when it has one."""
    text = _read(Path("/proc/self/cgroup"))
    folder = cgroup_dir(text) if text is not None else None
    if folder is None:
        return None
    for name in ("memory.max", "memory.limit_in_bytes"):
        value = _read(folder / name)
        if value is not None:
            limit = limit_of(value)
            return (folder, limit) if limit is not None else None
    return None


def read(flag: int | None) -> Memory:
    """This node's memory: ``flag`` (``--memory``), else its cgroup's limit, else what
    the machine has available now."""
    if flag is not None:
        return Memory(min(flag, MOST_MEMORY), "flag")
    found = _cgroup_limit()
    if found is not None:
        return Memory(min(found[1], MOST_MEMORY), "cgroup")
    return Memory(min(available(Path("/proc/meminfo").read_text()), MOST_MEMORY), "free")


def in_use() -> int:
    """What this node uses now: its cgroup's charge where the cgroup has a limit,
    else its resident set."""
    found = _cgroup_limit()
    if found is not None:
        for name in ("memory.current", "memory.usage_in_bytes"):
            value = _read(found[0] / name)
            if value is not None and value.strip().isdigit():
                return min(int(value), MOST_MEMORY)
    return min(resident(_read(Path("/proc/self/status")) or ""), MOST_MEMORY)
