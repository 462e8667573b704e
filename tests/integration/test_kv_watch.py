"""A KV watch keeps hearing its key across a server restart (hecate.bus.kv.watch).

nats-py's watcher is an ordered consumer the server holds in memory; a restarted server
has forgotten it, and the watcher would wait in silence. Routers, nodes, the planner and
the gateway follow the plan and the telemetry snapshot this way.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import nats
import pytest
from nats.js.kv import KeyValue

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer


async def _put(kv: KeyValue, key: str, value: bytes) -> None:
    for _ in range(200):  # until the client has reconnected and JetStream is back
        try:
            await kv.put(key, value)
            return
        except Exception:
            await asyncio.sleep(0.05)
    raise AssertionError("the restarted server never took the write")


@pytest.mark.parametrize("store", ["kept", "fresh"])
async def test_a_watch_hears_its_key_after_the_server_restarts(tmp_path: Path, store: str) -> None:
    server = NatsServer(tmp_path / "nats").start()
    port = server.client_port
    nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    seen: asyncio.Queue[bytes | None] = asyncio.Queue()
    try:
        kv = await kvs.bucket(nc, "hecate-plan")
        for value in (b"first", b"second", b"before"):  # revision 3: a fresh store's is 1
            await kv.put("k", value)

        async def follow() -> None:
            async for value, _revision in kvs.watch(kv, "k", check_s=0.2):
                await seen.put(value)

        task = asyncio.create_task(follow())
        assert await asyncio.wait_for(seen.get(), 10) == b"before"
        server.stop()
        where = tmp_path / ("nats" if store == "kept" else "nats-fresh")
        server = NatsServer(where, port=port).start()
        if store == "fresh":  # a new store: the bucket is made again, revisions restart
            for _ in range(200):
                with contextlib.suppress(Exception):
                    kv = await kvs.bucket(nc, "hecate-plan")
                    break
                await asyncio.sleep(0.05)
        await _put(kv, "k", b"after")
        # Fifty times the check: nats-py alone took some 15 s to hear again (if at all).
        assert await asyncio.wait_for(seen.get(), 10) == b"after"
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await nc.close()
        server.stop()
