"""Children that do not outlive the process that started them.

Each child runs in a session of its own (a Ctrl-C at the terminal must reach the
supervisor only), so nothing ties it to its parent: a supervisor killed with SIGKILL
would leave every service running and connected, with no owner. Two guards:

- On Linux the child asks the kernel for SIGTERM when its parent dies (:func:`spawn`,
  from :mod:`hecate.bus.children`, which the embedded NATS server uses too).
- Everywhere, the child is told its parent's pid (``HECATE_PARENT_PID``); a service
  watches for being handed to another parent and stops as on SIGTERM
  (:mod:`hecate.cli.process`). That also closes the last gap on Linux: a parent dying
  between the kernel request and the exec, while the child still carries the parent's
  signal handlers and the kernel's SIGTERM could be swallowed.

A child's own children (a download a node runs, say) share its process group: the
supervisor signals the whole group (:func:`signal_group`).
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from hecate.bus.children import parent_death_signal_available, spawn

__all__ = [
    "PARENT_PID_ENV",
    "orphaned",
    "parent_death_signal_available",
    "parent_watch",
    "signal_group",
    "spawn",
]

PARENT_PID_ENV = "HECATE_PARENT_PID"


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
