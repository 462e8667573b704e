"""A fault proxy: a TCP relay between one process and its NATS server that can make the
link slow, jittery, narrow, silent, reset or slow to close, while connections are live.

The process is given the proxy's URL instead of the server's; the proxy forwards each
connection it accepts to the first upstream that answers (a cluster's servers, in the
process's order), both ways. It relays bytes, never NATS frames, so TLS passes through
unchanged. When the bytes go out is :mod:`hecate_dev.chaos.toxics`' business (pure);
this module only reads, waits and writes.

The faults, all changeable at any moment from any event loop or thread
(:class:`FaultProxy`'s coroutines run in the proxy's own loop):

- ``set(latency_ms=, jitter_ms=, bandwidth=, direction=)``: the link's toxics.
- ``blackhole()``: nothing passes either way, and neither socket is closed: a half-open
  link. By default the bytes are *held* and the proxy stops reading, so the senders'
  buffers fill as behind a dead route; ``heal()`` then lets them through, late, as TCP's
  retransmissions would. A live TCP connection never loses bytes in the middle of its
  stream; ``blackhole(drop=True)`` does so anyway (bytes read are discarded): a SUB sent
  meanwhile is lost with its subscription, and what reaches the far side after the heal
  may be the tail of a cut NATS frame, which the server answers with an error and a close.
- ``reset()``: every current connection is closed with an RST on both sides
  (``SO_LINGER`` 0), as a restarted middlebox does; new connections are accepted.
- ``slow_close(ms)``: when one side closes, the other is closed that much later (after
  the bytes still queued for it), so it learns of the close late.
- ``clear()``: a clean link again. ``stats``: what passed, was dropped or was reset.

In the chaos harness, ``Swarm(..., proxied={"node-a0"})`` starts that process behind a
proxy of its own, in a :class:`ProxyThread`; ``swarm.proxy("node-a0")`` is the proxy.

Not guaranteed: exact delays. The proxy's loop shares the interpreter with whatever else
runs in it, so every delay is a lower bound (the schedule's), never an upper one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import TypeVar

from hecate_dev.chaos.relay import Link, ProxyStats, vanished
from hecate_dev.chaos.toxics import Direction, Toxics

__all__ = ["Direction", "FaultProxy", "ProxyStats", "ProxyThread", "Toxics"]

T = TypeVar("T")
Address = tuple[str, int]

_CONNECT_TIMEOUT_S = 1.0


class FaultProxy:
    """One listening port on 127.0.0.1 for one proxied process, relaying to the first of
    ``upstreams`` that accepts. Start it in a running loop (``await proxy.start()``);
    its control coroutines may then be awaited from any loop or thread."""

    def __init__(self, upstreams: Sequence[Address], *, seed: int | None = None) -> None:
        if not upstreams:
            raise ValueError("a proxy needs at least one upstream")
        self.upstreams = list(upstreams)
        self.rng = random.Random(seed)
        self.toxics: dict[Direction, Toxics] = dict.fromkeys(Direction, Toxics())
        self.slow_close_s = 0.0
        self.dropping = False
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.stats = ProxyStats()
        self.port = 0
        self._links: set[Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        """What the proxied process is given as ``--nats``."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        return len(self._links)

    async def start(self) -> FaultProxy:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop listening and reset every connection."""

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self._close_all()
            if self._handlers:  # each ends once its link is reset
                await asyncio.wait(self._handlers, timeout=5)

        await self._run(close)

    # -- the faults ------------------------------------------------------------------------

    async def set(
        self,
        *,
        latency_ms: float = 0.0,
        jitter_ms: float = 0.0,
        bandwidth: float | None = None,
        direction: Direction | None = None,
    ) -> None:
        """The link's toxics from now on, in ``direction`` or both: a one-way delay of
        ``latency_ms`` plus a jitter drawn in ``[0, jitter_ms]`` per chunk (the byte order
        is kept), and at most ``bandwidth`` bytes/s (``None``: no limit). Replaces what
        was set before; raises ``ValueError`` on a negative figure."""
        toxics = Toxics(latency_ms / 1000, jitter_ms / 1000, bandwidth)

        def apply() -> None:
            for d in (direction,) if direction is not None else Direction:
                self.toxics[d] = toxics

        await self._apply(apply)

    async def blackhole(self, *, drop: bool = False) -> None:
        """Nothing passes either way until :meth:`heal`; no socket is closed. ``drop``:
        discard the bytes instead of holding them (see the module's docstring)."""

        def apply() -> None:
            self.flowing.clear()
            self.dropping = drop
            if drop:
                self.flowing.set()  # read on, to throw away
                for link in self._links:
                    link.discard()

        await self._apply(apply)

    async def heal(self) -> None:
        """End a blackhole (held bytes go out at once); the toxics stay as set."""

        def apply() -> None:
            self.dropping = False
            self.flowing.set()

        await self._apply(apply)

    async def clear(self) -> None:
        """A clean link again: no blackhole, no toxics, no slow close."""
        await self.heal()
        await self.set()
        await self.slow_close(0)

    async def reset(self) -> int:
        """Close every current connection with an RST on both sides; returns how many."""
        return await self._apply(self._close_all)

    async def slow_close(self, delay_ms: float) -> None:
        """From now on, a side's close reaches the other ``delay_ms`` later."""

        def apply() -> None:
            self.slow_close_s = max(0.0, delay_ms / 1000)

        await self._apply(apply)

    # -- the relay -------------------------------------------------------------------------

    def _close_all(self) -> int:
        links = [link for link in self._links if not link.closed]
        for link in links:
            link.reset()
        self.stats.reset += len(links)
        return len(links)

    async def _apply(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the proxy's loop, whichever loop or thread awaits this."""

        async def call() -> T:
            return fn()

        return await self._run(call)

    async def _run(self, fn: Callable[[], Coroutine[None, None, T]]) -> T:
        assert self._loop is not None, "start() first"
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is self._loop:
                return await fn()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(), self._loop))

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for host, port in self.upstreams:
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(
                    asyncio.open_connection(host, port), _CONNECT_TIMEOUT_S
                )
        return None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        server = await self._dial()
        if server is None:
            self.stats.refused += 1
            writer.close()
            return
        link = Link(self, (reader, writer), server)
        link.task = asyncio.create_task(link.run())
        self._links.add(link)
        try:
            # Waited on, not awaited: a reset cancels the link, not this handler.
            await asyncio.wait({link.task})
            exc = None if link.task.cancelled() else link.task.exception()
            if exc is not None and not vanished(exc):
                raise exc
        finally:
            link.task.cancel()
            self._links.discard(link)
            for w in link.writers:
                w.close()


class ProxyThread:
    """An event loop in a thread of its own for the proxies of a swarm, so that they
    serve whoever else blocks or keeps busy (the harness's synchronous start-up, the
    load's loop). Its proxies' coroutines may be awaited from any other loop."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="hecate-fault-proxy", daemon=True
        )
        self._thread.start()
        self.proxies: list[FaultProxy] = []

    def start_proxy(self, upstreams: Sequence[Address], *, seed: int | None = None) -> FaultProxy:
        """A new proxy to ``upstreams``, listening once this returns."""

        async def start() -> FaultProxy:
            return await FaultProxy(upstreams, seed=seed).start()

        proxy = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.proxies.append(proxy)
        return proxy

    def stop(self) -> None:
        """Stop every proxy, then the loop and its thread."""

        async def stop_all() -> None:
            for proxy in self.proxies:
                await proxy.stop()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop_all(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
