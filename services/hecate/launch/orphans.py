"""Children that do not outlive the process that started them.

Each child runs in a session of its own (a Ctrl-C at the terminal must reach the
supervisor only), so nothing ties it to its parent: a supervisor killed with SIGKILL
would leave every service running and connected, with no owner. Two guards:

- On Linux the child asks the kernel for SIGTERM when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``, set between fork and exec; it survives the exec). The
  kernel sends it when the *thread* that forked the child exits, not the process: a
  child forked from a worker thread (``asyncio.to_thread``) would be stopped when that
  worker retires. So every child is forked from one thread that lives as long as this
  process (:func:`spawn`). A parent that died before the request was made is caught by
  checking ``getppid()`` right after it.
- Everywhere, the child is told its parent's pid (``HECATE_PARENT_PID``); a service
  watches for being handed to another parent and stops as on SIGTERM
  (:mod:`hecate.cli.process`). That also closes the last gap on Linux: a parent dying
  between the request and the exec, while the child still carries the parent's signal
  handlers and the kernel's SIGTERM could be swallowed.

A child's own children (a download a node runs, say) share its process group: the
supervisor signals the whole group (:func:`signal_group`).
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

PARENT_PID_ENV = "HECATE_PARENT_PID"

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


def signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    """Send ``sig`` to a running child started by :func:`spawn` and to every process in
    its group (its own children), not to one already reaped (its pid may be reused)."""
    if proc.poll() is not None:
        return
    try:
        if os.getpgid(proc.pid) == proc.pid:  # its own session: the group's id is its pid
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


def parent_watch() -> int | None:
    """The pid this process's supervisor gave it (and forget it, so that this process's
    own children do not take it for theirs), or None when no supervisor started it."""
    value = os.environ.pop(PARENT_PID_ENV, "")
    return int(value) if value.isdigit() else None


def orphaned(parent: int) -> bool:
    """True once the process that started this one is gone (this one was handed to
    another parent, init or a subreaper)."""
    return os.getppid() != parent
