"""A reader's wait for a KV bucket stops when cancelled, even when the call it was in
lost the cancel (nats-py's ``asyncio.wait_for`` on Python 3.11 drops a cancel that lands
as the reply does; the task then looped on, and the task group around it, a gateway's
swarm watch, never ended).

The lost cancel is a race inside nats-py that no real server can be made to lose on
demand, so the JetStream handle here loses the first cancel it is given, as that race
does, and then behaves like a server whose bucket does not exist yet."""

from __future__ import annotations

import asyncio
import contextlib
from typing import cast

import pytest
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError

from hecate.bus.kv import still_cancelled, wait_bucket


class _LosesOneCancel:
    def __init__(self) -> None:
        self.calls = 0
        self.lost = False

    async def key_value(self, name: str) -> object:
        del name
        self.calls += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if self.lost:
                raise
            self.lost = True  # as wait_for does when the reply lands with the cancel
        raise BucketNotFoundError


class _Client:
    def __init__(self) -> None:
        self.js = _LosesOneCancel()

    def jetstream(self) -> _LosesOneCancel:
        return self.js


async def test_a_cancel_lost_inside_nats_py_still_stops_the_wait_for_a_bucket() -> None:
    nc = _Client()
    task = asyncio.create_task(wait_bucket(cast(Client, nc), "plan", poll_s=0.01))
    await asyncio.sleep(0.05)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    if not done:  # the old loop: a second cancel, which the handle does not lose
        task.cancel()
        await asyncio.wait({task}, timeout=2)
    assert done, "the wait went on after its cancel"
    assert task.cancelled()
    assert nc.js.lost
    assert nc.js.calls == 1


async def test_still_cancelled_is_silent_unless_a_cancel_is_pending() -> None:
    still_cancelled()  # nothing pending: returns

    async def swallows() -> str:
        with contextlib.suppress(asyncio.CancelledError):  # as a lost cancel
            await asyncio.sleep(3600)
        still_cancelled()
        return "went on"

    task = asyncio.create_task(swallows())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # A timeout's own cancel is taken back when it fires: nothing is pending after it.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)
    still_cancelled()
