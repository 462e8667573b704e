"""One supervisor for a swarm's processes: each is a :class:`ProcessSpec` (a label, the
``hecate`` arguments an operator would type, its extra environment), and the
:class:`Supervisor` starts, kills, restarts and stops them and keeps their output.

``hecate up``, the chaos harness, the benchmarks and the integration tests' swarm all use
it, so a process is started, signalled and stopped the same way whoever runs it: in a
session of its own (a Ctrl-C at the terminal reaches the supervisor, which stops the
services in order, not every process at once), and stopped with SIGTERM first (services
drain on it), SIGKILL only after a grace period. A signal goes to the process's whole group,
its own children with it. Every child stops when the supervisor dies, even by SIGKILL
(:mod:`hecate.cli.orphans`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from hecate.cli.orphans import PARENT_PID_ENV, signal_group, spawn


def hecate_command() -> list[str]:
    """The argv that runs this installation's ``hecate``: the console script beside this
    Python, else the module through this Python."""
    script = Path(sys.executable).with_name("hecate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hecate.cli.main"]


@dataclass(frozen=True)
class ProcessSpec:
    """One process. ``argv`` follows ``program`` (this installation's ``hecate`` unless
    given); ``env`` is laid over the supervisor's environment."""

    label: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    program: tuple[str, ...] | None = None

    def command(self) -> list[str]:
        return [*(self.program if self.program is not None else hecate_command()), *self.argv]


LineSink = Callable[[str, str], None]  # (label, line without its newline)


class Supervisor:
    """The processes of one swarm, by label.

    Output goes to ``<logs>/<label>.log`` (appended to across restarts) when ``logs`` is
    given, else line by line to ``on_line`` (from a reader thread per process), else
    nowhere. ``env``: the base environment of every process (default: this one's as it
    is when the process starts).
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        logs: Path | None = None,
        on_line: LineSink | None = None,
    ) -> None:
        self.env = None if env is None else dict(env)
        self.logs = logs
        self.on_line = on_line
        self.specs: dict[str, ProcessSpec] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- one process ---------------------------------------------------------------------

    def start(self, spec: ProcessSpec) -> subprocess.Popen[bytes]:
        """Start ``spec`` (a label already running is an error: restart it instead)."""
        if spec.label in self.procs and self.procs[spec.label].poll() is None:
            raise RuntimeError(f"{spec.label} is already running")
        self.specs[spec.label] = spec
        return self._spawn(spec)

    def run(self, label: str, *argv: str, **env: str) -> subprocess.Popen[bytes]:
        """``start(ProcessSpec(label, argv, env))``."""
        return self.start(ProcessSpec(label, argv, env))

    def _spawn(self, spec: ProcessSpec) -> subprocess.Popen[bytes]:
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.logs is not None:
            out = self.log_path(spec.label).open("ab")
        elif self.on_line is not None:
            out = subprocess.PIPE
        try:
            env = {**(os.environ if self.env is None else self.env), **spec.env}
            env[PARENT_PID_ENV] = str(os.getpid())
            proc: subprocess.Popen[bytes] = spawn(
                spec.command(), stdout=out, stderr=subprocess.STDOUT, env=env
            )
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own copy
        self.procs[spec.label] = proc
        if self.on_line is not None and proc.stdout is not None:
            threading.Thread(
                target=_pump, args=(spec.label, proc.stdout, self.on_line), daemon=True
            ).start()
        return proc

    def kill(
        self, label: str, sig: int = signal.SIGKILL, *, wait: bool = True, timeout_s: float = 15
    ) -> None:
        """Send ``sig`` to a process and its children; ``wait``: until it has exited
        (not for a signal that only freezes it, such as SIGSTOP)."""
        proc = self.procs[label]
        signal_group(proc, sig)
        if wait:
            proc.wait(timeout_s)

    def restart(self, label: str) -> subprocess.Popen[bytes]:
        """Stop ``label`` if it runs (SIGTERM: it drains), then start it again as it was."""
        if self.alive(label):
            self.kill(label, signal.SIGTERM)
        return self._spawn(self.specs[label])

    def alive(self, label: str) -> bool:
        return label in self.procs and self.procs[label].poll() is None

    def pid(self, label: str) -> int:
        return self.procs[label].pid

    def log_path(self, label: str) -> Path:
        if self.logs is None:
            raise RuntimeError("this supervisor keeps no log files")
        return self.logs / f"{label.replace(' ', '-')}.log"

    def log(self, label: str) -> str:
        return self.log_path(label).read_text(errors="replace")

    # -- all of them ---------------------------------------------------------------------

    def stop(self, order: Sequence[str] = ("",), grace_s: float = 10.0) -> list[str]:
        """Stop every process still running, group by group: the labels starting with
        ``order[0]`` first, and so on (``""`` matches the rest). Each group gets SIGTERM,
        then SIGKILL whatever is still running ``grace_s`` later. Returns the labels
        that had to be killed."""
        killed: list[str] = []
        left = dict(self.procs)
        for prefix in order:
            group = {k: p for k, p in left.items() if k.startswith(prefix)}
            for label in group:
                del left[label]
            killed += terminate(group, grace_s)
        return killed + terminate(left, grace_s)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def terminate(procs: Mapping[str, subprocess.Popen[Any]], grace_s: float) -> list[str]:
    """SIGTERM each process still running (with its group), SIGKILL those not gone
    ``grace_s`` later; the labels killed."""
    for proc in procs.values():
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed: list[str] = []
    for label, proc in procs.items():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
            killed.append(label)
    return killed


def _pump(label: str, stream: IO[bytes], sink: LineSink) -> None:
    with stream:
        for line in stream:
            sink(label, line.decode(errors="replace").rstrip("\n"))
