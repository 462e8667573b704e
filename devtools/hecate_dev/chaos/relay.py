"""One relayed connection of the fault proxy (:mod:`hecate_dev.chaos.proxy`): two
pipes, each reading one side and writing the other when the link's schedule says, and
what they count.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hecate_dev.chaos.toxics import Direction, LinkSchedule, Toxics

if TYPE_CHECKING:
    from hecate_dev.chaos.proxy import FaultProxy

_READ = 64 * 1024
# Bytes queued in one direction before the proxy stops reading it: a narrow link pushes
# back on its sender instead of growing a buffer without bound.
_QUEUE_LIMIT = 1024 * 1024
_CLEAN = Toxics()


@dataclass
class ProxyStats:
    """What the proxy did, for a scenario to show its fault hit live traffic."""

    accepted: int = 0  # connections from the process
    refused: int = 0  # accepted, then closed: no upstream answered
    reset: int = 0  # connections closed with an RST by reset()
    forwarded: dict[Direction, int] = field(default_factory=lambda: dict.fromkeys(Direction, 0))
    dropped: dict[Direction, int] = field(default_factory=lambda: dict.fromkeys(Direction, 0))


def vanished(exc: BaseException) -> bool:
    """A side closed under a write: the only way a link is expected to fail."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(OSError)[1] is None
    return isinstance(exc, OSError)


class _Pipe:
    """One direction of one connection."""

    def __init__(
        self,
        proxy: FaultProxy,
        direction: Direction,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.direction = direction
        self.reader = reader
        self.writer = writer
        self.schedule = LinkSchedule(proxy.toxics[direction], proxy.rng)
        self.queue: deque[tuple[float, bytes]] = deque()
        self.queued = 0
        self.more = asyncio.Event()  # something queued, or the source ended
        self.room = asyncio.Event()  # the queue fell under its limit
        self.ended = False

    async def read(self) -> None:
        p, loop = self.proxy, asyncio.get_running_loop()
        try:
            while True:
                await p.flowing.wait()  # held: read nothing, as a dead route carries nothing
                while self.queued >= _QUEUE_LIMIT:
                    self.room.clear()
                    await self.room.wait()
                data = await self.reader.read(_READ)
                if not data:
                    break
                if p.dropping:
                    p.stats.dropped[self.direction] += len(data)
                    continue
                toxics = self.schedule.toxics = p.toxics[self.direction]
                if toxics == _CLEAN and not self.queue and p.flowing.is_set():
                    # Nothing to wait for and nothing ahead of it: out at once, without
                    # waking the writer (a clean proxied link costs little).
                    self.writer.write(data)
                    p.stats.forwarded[self.direction] += len(data)
                    await self.writer.drain()
                    continue
                offset = 0
                for r in self.schedule.release(loop.time(), len(data)):
                    self.queue.append((r.at, data[offset : offset + r.size]))
                    offset += r.size
                self.queued += len(data)
                self.more.set()
        except OSError:
            pass  # a reset from the source ends it as a close does
        finally:
            self.ended = True
            self.more.set()

    async def write(self) -> None:
        """Returns once the source has ended and everything read from it is out."""
        p, loop = self.proxy, asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            while self.queue or not self.ended:
                if not self.queue:
                    self.more.clear()
                    await self.more.wait()
                    continue
                if not p.flowing.is_set():
                    await p.flowing.wait()
                    continue
                if p.dropping:
                    self.discard()
                    continue
                at, data = self.queue[0]
                if (wait := at - loop.time()) > 0:
                    await asyncio.sleep(wait)  # then look again: a fault may have come
                    continue
                self.queue.popleft()
                self.queued -= len(data)
                self.room.set()
                self.writer.write(data)
                p.stats.forwarded[self.direction] += len(data)
                await self.writer.drain()

    def discard(self) -> None:
        self.proxy.stats.dropped[self.direction] += self.queued
        self.queue.clear()
        self.queued = 0
        self.room.set()


class Link:
    """One proxied connection: the process's side and the server's side."""

    def __init__(
        self,
        proxy: FaultProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.task: asyncio.Task[None] | None = None  # the one running run()
        self.closed = False
        self.writers = (client[1], server[1])
        self.pipes = (
            _Pipe(proxy, Direction.UP, client[0], server[1]),
            _Pipe(proxy, Direction.DOWN, server[0], client[1]),
        )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            readers = [tg.create_task(pipe.read()) for pipe in self.pipes]
            writers = [tg.create_task(pipe.write()) for pipe in self.pipes]
            # One side closed and all it sent has gone out: the other learns of it now,
            # or slow_close later.
            await asyncio.wait(writers, return_when=asyncio.FIRST_COMPLETED)
            if self.proxy.slow_close_s > 0 and not self.closed:
                await asyncio.sleep(self.proxy.slow_close_s)
            for w in self.writers:
                w.close()
            for task in (*readers, *writers):
                task.cancel()

    def discard(self) -> None:
        for pipe in self.pipes:
            pipe.discard()

    def reset(self) -> None:
        """Both sides get an RST: closing with a zero linger time sends one."""
        self.closed = True
        for w in self.writers:
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()
        if self.task is not None:  # a held link would otherwise wait for the heal
            self.task.cancel()
