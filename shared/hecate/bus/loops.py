"""A service's background loops (watches, sweeps, heartbeats), in one task group.

A loop that raises is a service that no longer does its job (a node whose plan watch
died still heartbeats, so it looks alive but never learns a new plan): it is logged
with the loop's name and recorded as the group's :attr:`Loops.failure`, the group
cancels the others, and the owner's ``on_failure`` runs (the service shell closes its
connections and cancels the task that started it, so that the process exits nonzero
and its supervisor restarts it). Cancelling the loops on :meth:`Loops.close` is not a
failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Awaitable, Callable, Coroutine

from hecate.bus.logs import event

__all__ = ["LoopFailed", "Loops"]


class LoopFailed(Exception):
    """A background loop of a service raised: the service cannot go on as it was."""

    def __init__(self, loop: str, error: Exception) -> None:
        super().__init__(f"background loop {loop} failed: {error!r}")
        self.loop = loop
        self.error = error


def _loop_name(work: Awaitable[None]) -> str:
    # A coroutine's qualified name says which loop it is (``Holdings.follow``).
    return str(getattr(work, "__qualname__", None) or type(work).__name__)


async def _nothing() -> None:
    """What a loop spawned too late (after close, or after a failure) becomes."""


class Loops:
    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.failure: LoopFailed | None = None  # the first loop that failed, if one did
        self._background: set[asyncio.Task[None]] = set()
        self._group: asyncio.TaskGroup | None = None  # while it is open
        self._supervisor: asyncio.Task[None] | None = None  # the task holding it open
        self._closing = asyncio.Event()  # close: the loops are being cancelled

    async def open(self, name: str, on_failure: Callable[[LoopFailed], Awaitable[None]]) -> None:
        """Open the group; ``on_failure`` runs once if a loop fails before close."""
        opened = asyncio.Event()
        self._supervisor = asyncio.create_task(self._supervise(opened, on_failure), name=name)
        await opened.wait()  # spawn may be called as soon as this returns

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """A loop in the group: cancelled on close; if it raises, the group fails.
        Spawned after close has begun, or after a failure, it never runs."""
        name = _loop_name(coro)
        group = self._group
        assert self._supervisor is not None, "loops not opened"
        task: asyncio.Task[None] | None = None
        if group is not None and not self._closing.is_set() and self.failure is None:
            # The group refuses new tasks once a loop has failed and it is cancelling
            # the others: a loop started then would outlive the service.
            with contextlib.suppress(RuntimeError):
                task = group.create_task(self._run(name, coro), name=name)
        if task is None:
            if isinstance(coro, Coroutine):
                coro.close()  # never awaited, on purpose: no warning for it
            task = asyncio.create_task(_nothing(), name=name)
            task.cancel()
            return task
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def close(self, grace: float) -> None:
        """Cancel every loop and wait (up to ``grace``) for the group to close."""
        self._closing.set()
        if self._supervisor is not None:
            await asyncio.wait([self._supervisor], timeout=grace)

    async def _run(self, name: str, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:
            if self._closing.is_set() or self.failure is not None:
                # Raised as it was cancelled (close, or another loop's failure): the
                # service is going away already; this one is not its cause.
                event(
                    self.log,
                    "background loop error while stopping",
                    logging.WARNING,
                    loop=name,
                    error=repr(exc),
                )
                return
            self.failure = LoopFailed(name, exc)
            event(
                self.log,
                "background loop failed",
                logging.ERROR,
                loop=name,
                error=repr(exc),
                exception="".join(traceback.format_exception(exc)),
            )
            raise self.failure from exc

    async def _supervise(
        self, opened: asyncio.Event, on_failure: Callable[[LoopFailed], Awaitable[None]]
    ) -> None:
        """Hold the group open until close (which cancels the loops) or until one of
        them fails (the group cancels the others); then, on a failure not already
        closing, tell the owner."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                opened.set()
                await self._closing.wait()
                for task in list(self._background):
                    task.cancel()
        except* LoopFailed:
            pass  # logged where it was raised; self.failure says which
        finally:
            self._group = None
        if self.failure is not None and not self._closing.is_set():
            await on_failure(self.failure)
