"""Child processes that do not outlive the process that started them (Linux).

A child that runs in a session of its own (a Ctrl-C at the terminal must reach its
owner only) has nothing tying it to its parent: an owner killed with SIGKILL would leave
it running. So the child asks the kernel for SIGTERM when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, set between fork and exec; it survives the exec). The
kernel sends it when the *thread* that forked the child exits, not the process: a child
forked from a worker thread (``asyncio.to_thread``) would be stopped when that worker
retires. So every child is forked from one thread that lives as long as this process
(:func:`spawn`). A parent that died before the request was made is caught by checking
``getppid()`` right after it.

Here rather than with the supervisor (:mod:`hecate.cli.orphans`, which adds what a
service does on platforms without the signal) because the embedded NATS server
(:mod:`hecate.bus.server`) starts its process this way too.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    # Resolved here, in the parent: the child, between fork and exec, only calls it.
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]  # type: ignore[attr-defined]
    prctl.restype = ctypes.c_int  # type: ignore[attr-defined]
    return prctl


_prctl = _load_prctl()


def parent_death_signal_available() -> bool:
    """True where the kernel can stop a child when its parent dies (Linux)."""
    return _prctl is not None


def _die_with(parent: int) -> Callable[[], None]:
    prctl = _prctl
    assert prctl is not None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0)
        if os.getppid() != parent:
            # The parent died before the request: the child would never be told. Not
            # a signal to itself: its handlers are still the parent's until the exec.
            os._exit(1)

    return preexec


class _Spawner:
    """One daemon thread that forks every child: it lives until this process exits,
    so the kernel's parent-death signal fires when the process dies, not when the
    thread that happened to ask for the child retires."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[concurrent.futures.Future[subprocess.Popen[Any]], list[str], dict[str, Any]]
        ] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def popen(self, args: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[Any]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="spawner", daemon=True)
                self._thread.start()
        done: concurrent.futures.Future[subprocess.Popen[Any]] = concurrent.futures.Future()
        self._jobs.put((done, args, kwargs))
        return done.result()

    def _run(self) -> None:
        while True:
            done, args, kwargs = self._jobs.get()
            try:
                done.set_result(subprocess.Popen(args, **kwargs))
            except BaseException as exc:  # handed to the caller, who raises it
                done.set_exception(exc)


_spawner = _Spawner()


def spawn(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **kwargs)`` in a session of its own, for a child that
    stops (SIGTERM) when this process dies, where the platform can say so."""
    kwargs["start_new_session"] = True
    if _prctl is None:
        return subprocess.Popen(list(args), **kwargs)
    kwargs["preexec_fn"] = _die_with(os.getpid())
    return _spawner.popen(list(args), kwargs)
