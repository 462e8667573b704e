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


async def test_follow_decodes_skips_what_does_not_decode_and_says_when_deleted(
    tmp_path: Path,
) -> None:
    """What every follower of the plan and the snapshot gets (hecate.bus.kv.follow): each
    value decoded with its revision, a bad one handed to ``on_bad`` and never yielded,
    and a deleted key as None."""
    import msgspec

    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    seen: asyncio.Queue[tuple[dict[str, int] | None, int]] = asyncio.Queue()
    bad: list[int] = []
    decoder = msgspec.json.Decoder(dict[str, int])
    try:
        kv = await kvs.bucket(nc, "hecate-plan")
        await kv.put("k", b'{"a": 1}')

        async def follow() -> None:
            on_bad = lambda revision, _exc: bad.append(revision)  # noqa: E731
            async for value, revision in kvs.follow(kv, "k", decoder, on_bad):
                await seen.put((value, revision))

        task = asyncio.create_task(follow())
        assert await asyncio.wait_for(seen.get(), 10) == ({"a": 1}, 1)
        await kv.put("k", b"{not json")
        await kv.put("k", b'{"a": "not an int"}')
        await kv.put("k", b'{"a": 4}')
        assert await asyncio.wait_for(seen.get(), 10) == ({"a": 4}, 4)
        assert bad == [2, 3]
        await kv.delete("k")
        assert await asyncio.wait_for(seen.get(), 10) == (None, 5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await nc.close()
        server.stop()
