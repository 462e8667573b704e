"""A KV value of any size (hecate.bus.kv.put / get / watch): one larger than a message
may be is stored in parts, under a head that names them, and read back whole.

A plan or a telemetry snapshot of thousands of nodes passes NATS's max_payload (1 MB by
default); stored whole, the write is refused and the swarm stops being planned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import nats
import pytest
from nats.js.errors import KeyWrongLastSequenceError

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer


def _value(size: int) -> bytes:
    return os.urandom(size // 2).hex().encode()[:size]


async def test_a_value_past_max_payload_is_stored_in_parts_and_read_whole(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    try:
        assert nc.max_payload <= 1024 * 1024
        kv = await kvs.bucket(nc, "hecate-plan")
        big = _value(nc.max_payload * 3 // 2)
        with pytest.raises(Exception, match=r"(?i)payload"):
            await kv.put("whole", big)  # what a plan of thousands of nodes met before

        revision = await kvs.put(kv, "current", big, writer="planner-a")
        assert await kvs.get(kv, "current") == (big, revision)
        head = (await kv.get("current")).value or b""
        assert len(head) < 1024  # the key itself holds only the head
        parts = [k for k in await kv.keys() if k.startswith("current.part.planner-a.")]
        assert len(parts) == -(-len(big) // kvs.PART_BYTES)

        small = b'{"epoch": 1}'
        revision = await kvs.put(kv, "current", small, writer="planner-a")
        assert (await kv.get("current")).value == small  # small values stay as they were
        assert await kvs.get(kv, "current") == (small, revision)
        assert await kvs.get(kv, "nothing") == (None, 0)
    finally:
        await nc.close()
        server.stop()


async def test_a_lost_compare_and_set_leaves_the_winners_parts_alone(tmp_path: Path) -> None:
    """Each writer has its own part keys: a planner that loses the head's
    compare-and-set has written only its own parts, never the winner's."""
    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    try:
        kv = await kvs.bucket(nc, "hecate-plan")
        first = await kvs.put(kv, "current", b"{}", writer="a")
        ours = _value(kvs.PART_BYTES * 2 + 5)
        won = await kvs.put(kv, "current", ours, writer="a", last=first)
        with pytest.raises(KeyWrongLastSequenceError):
            await kvs.put(kv, "current", _value(kvs.PART_BYTES * 3), writer="b", last=first)
        assert await kvs.get(kv, "current") == (ours, won)
    finally:
        await nc.close()
        server.stop()


async def test_a_head_whose_parts_moved_on_is_skipped_for_the_newer_one(tmp_path: Path) -> None:
    """In a bucket that keeps one revision a key (the snapshot's), a writer's next
    value replaces its parts: the older head can no longer be read whole, and readers
    take the newer one instead."""
    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    seen: asyncio.Queue[tuple[bytes | None, int]] = asyncio.Queue()
    try:
        kv = await kvs.bucket(nc, "hecate-telemetry")
        one, two = _value(kvs.PART_BYTES + 10), _value(kvs.PART_BYTES + 20)
        await kvs.put(kv, "snapshot", one, writer="t")
        old_head = (await kv.get("snapshot")).value or b""
        assert await kvs.whole(kv, old_head) == one
        revision = await kvs.put(kv, "snapshot", two, writer="t")
        assert await kvs.whole(kv, old_head) is None
        assert await kvs.get(kv, "snapshot") == (two, revision)

        async def watch() -> None:
            async for value, at in kvs.watch(kv, "snapshot"):
                await seen.put((value, at))

        task = asyncio.create_task(watch())
        assert await asyncio.wait_for(seen.get(), 10) == (two, revision)
        three = _value(kvs.PART_BYTES * 2)
        revision = await kvs.put(kv, "snapshot", three, writer="t")
        assert await asyncio.wait_for(seen.get(), 10) == (three, revision)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await nc.close()
        server.stop()
