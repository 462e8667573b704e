"""cgroup v1's memory controller, for holding a process to a memory limit and reading
what it used: the proof that a node's weights are resident once (``hecate bench memory``).

A :class:`MemoryCgroup` is a folder ``/sys/fs/cgroup/memory/hecate-NAME`` with
``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where the kernel counts
swap, so that swap cannot hide use) set to the limit. Its processes start through a
small shell that writes its own pid to the group's ``cgroup.procs`` and then ``exec``s
the command (:meth:`MemoryCgroup.command`): the command runs inside the group from its
first instruction, without a ``preexec_fn``, and does not run at all if the write fails.
On leaving the ``with`` block what is left in the group is killed and the folder removed.

The group counts the page cache its processes bring in (a mapped file's pages read
first by them) beside their anonymous memory: :class:`MemoryUse` has both, from
``memory.stat``. Pages already cached by another group stay charged there.

``available()`` says whether the controller is there and writable here (root, cgroup
v1), with the reason when not; callers skip with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

#: cgroup v1's memory hierarchy
ROOT = Path("/sys/fs/cgroup/memory")
#: a limit at or above this is none (the kernel writes 2**63 rounded down to a page)
NO_LIMIT = 2**60


@dataclass(frozen=True)
class Availability:
    """Whether :class:`MemoryCgroup` works here; ``reason`` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def available(root: Path = ROOT) -> Availability:
    """Whether cgroup v1's memory controller is mounted at ``root`` and this process can
    make a group there (tried: a probe group made and removed)."""
    if not (root / "memory.limit_in_bytes").exists():
        return Availability(False, f"no cgroup v1 memory controller at {root}")
    if not os.access(root, os.W_OK):
        return Availability(False, f"{root} is not writable (cgroups need root)")
    probe = root / f"hecate-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        (probe / "memory.limit_in_bytes").write_text(str(64 * 2**20))
    except OSError as exc:
        return Availability(False, f"cannot make a memory cgroup in {root}: {exc}")
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return Availability(True)


@dataclass(frozen=True)
class MemoryUse:
    """What a group holds and held, bytes (``stat``: ``memory.stat``'s counters, among
    them ``rss``, ``cache`` and ``mapped_file``)."""

    limit: int
    usage: int
    max_usage: int
    #: times the limit was hit (memory, and memory with swap)
    failcnt: int
    memsw_failcnt: int
    #: processes of the group the OOM killer killed
    oom_kills: int
    under_oom: bool
    stat: dict[str, int]

    @property
    def oom_killed(self) -> bool:
        return self.oom_kills > 0

    @property
    def rss(self) -> int:
        """Anonymous memory (``memory.stat``'s ``rss``)."""
        return self.stat.get("rss", 0)

    @property
    def cache(self) -> int:
        """Page cache charged to the group (mapped files' pages included)."""
        return self.stat.get("cache", 0)


def _read_int(path: Path, default: int = 0) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _read_pairs(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


class MemoryCgroup:
    """A cgroup v1 memory group of ``limit_bytes`` (``None``: no limit, only counting),
    made on entering (or :meth:`create`) and removed, with what is left in it killed, on
    leaving (or :meth:`close`).

    >>> with MemoryCgroup("demo", 200 * 2**20) as group:  # doctest: +SKIP
    ...     done = group.run([sys.executable, "-c", "..."])
    ...     group.use().oom_killed
    """

    def __init__(self, name: str, limit_bytes: int | None, *, root: Path = ROOT) -> None:
        self.name = name
        self.limit_bytes = limit_bytes
        self.path = root / f"hecate-{name}"

    # lifecycle -------------------------------------------------------------------

    def create(self) -> MemoryCgroup:
        if self.path.exists():  # a run before left it: empty it, start afresh
            self.close()
        self.path.mkdir()
        if self.limit_bytes is not None:
            # The memory limit first: memsw's may not be set below it.
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(self.limit_bytes))
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        """Kill what is left in the group, then remove it (retried while the killed
        processes finish exiting)."""
        if not self.path.exists():
            return
        self.kill(timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __enter__(self) -> MemoryCgroup:
        return self.create()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # processes -------------------------------------------------------------------

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def command(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` wrapped so that it runs in the group from its start: a shell writes its
        pid to ``cgroup.procs``, then becomes ``cmd`` (``exec``); if the write fails the
        shell exits non-zero and ``cmd`` never runs."""
        script = f'echo $$ > {self.procs} && exec "$@"'
        return ["sh", "-c", script, "sh", *cmd]

    def popen(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` of ``cmd`` inside the group (``kwargs`` as Popen's),
        returned once its pid is in the group (or it has exited): what :meth:`kill`
        kills from then on includes it."""
        process = subprocess.Popen(self.command(cmd), **kwargs)
        deadline = time.monotonic() + 10
        while process.pid not in self.pids() and process.poll() is None:
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise TimeoutError(f"{cmd[0]} did not join {self.path} in 10s")
            time.sleep(0.005)
        return process

    def run(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` of ``cmd`` inside the group (``kwargs`` as run's)."""
        return subprocess.run(self.command(cmd), **kwargs)

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL every process in the group until none is left (or ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)

    # figures ---------------------------------------------------------------------

    def use(self) -> MemoryUse:
        """The group's counters now (``max_usage``: its peak since it was made)."""
        p = self.path
        oom = _read_pairs(p / "memory.oom_control")
        return MemoryUse(
            limit=_read_int(p / "memory.limit_in_bytes"),
            usage=_read_int(p / "memory.usage_in_bytes"),
            max_usage=_read_int(p / "memory.max_usage_in_bytes"),
            failcnt=_read_int(p / "memory.failcnt"),
            memsw_failcnt=_read_int(p / "memory.memsw.failcnt"),
            oom_kills=oom.get("oom_kill", 0),
            under_oom=bool(oom.get("under_oom", 0)),
            stat=_read_pairs(p / "memory.stat"),
        )

    @property
    def max_usage_bytes(self) -> int:
        return _read_int(self.path / "memory.max_usage_in_bytes")

    @property
    def oom_killed(self) -> bool:
        return self.use().oom_killed
