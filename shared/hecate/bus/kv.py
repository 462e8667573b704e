"""JetStream KV helpers: create a bucket (its owner), wait for one (its readers), and
watch one key's latest value, raw (:func:`watch`) or decoded (:func:`follow`, how every
service follows the plan and the telemetry snapshot).

Each bucket has one owner, the only service allowed to create and write it (the NATS
permissions in deploy/ enforce it): the planner owns the plan, telemetry the snapshot,
the breaker service the circuits. Readers never create a bucket; they wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from hecate.bus.logs import event
from hecate.wire import subjects


async def bucket(nc: Client, name: str, *, replicas: int = 1) -> KeyValue:
    """The bucket ``name``, created (idempotently, with the history
    :data:`subjects.BUCKET_HISTORY` sets for it) if it does not exist yet. Production
    clusters pre-create buckets with 3 replicas (see deploy/)."""
    js = nc.jetstream()
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        return await js.create_key_value(
            bucket=name, history=subjects.BUCKET_HISTORY.get(name, 1), replicas=replicas
        )


def still_cancelled() -> None:
    """Raise the cancellation a library lost. nats-py waits for its replies with
    ``asyncio.wait_for``, which on Python 3.11 drops a cancel that lands as the reply
    does: the call returns, and a loop calling it again runs on as if it had never been
    cancelled (a task group waiting for it then never ends). The task still counts the
    request (``Task.cancelling``), so a loop asks here after each such call."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def wait_bucket(nc: Client, name: str, *, poll_s: float = 0.2) -> KeyValue:
    """The bucket ``name`` once its owner has created it (polled; cancel to give up).
    Run it in a background task: a reader must not wait for another service to start."""
    js = nc.jetstream()
    while True:
        # Not created yet, or disconnected or timed out (the client reconnects on its
        # own): ask again.
        with contextlib.suppress(Exception):
            found = await js.key_value(name)
            still_cancelled()
            return found
        still_cancelled()
        await asyncio.sleep(poll_s)


async def watch(
    kv: KeyValue, key: str, *, check_s: float = 1.0
) -> AsyncIterator[tuple[bytes | None, int]]:
    """``(value, revision)`` for the current value (if any) and then every update.

    A deleted or purged key yields ``(None, revision)``. Runs until cancelled.

    nats-py's watcher is an ordered consumer the server holds in memory: a server
    restarted (or a reconnect to another) forgets it, and nats-py then waits in silence
    for updates that never come. So after ``check_s`` without one, the key's revision is
    read directly. A newer one than the last yielded means the watcher went deaf: a
    fresh one takes over from the current value, and what was already yielded is not
    yielded again. An older one means the bucket itself started over (a server with a
    fresh store): everything it holds is new."""
    last = 0
    while True:
        watcher = await kv.watch(key)
        try:
            still_cancelled()
            while True:
                try:
                    # Not watcher.updates(timeout): its asyncio.wait_for can swallow a
                    # cancel that lands as it times out (Python 3.11), and this loop
                    # would then never end.
                    async with asyncio.timeout(check_s):
                        entry = await anext(watcher)
                except StopAsyncIteration:
                    break  # stopped under us: watch again
                except TimeoutError:
                    now = await _revision(kv, key)
                    still_cancelled()
                    if now > last:
                        break
                    if 0 < now < last:
                        last = 0
                        break
                    continue
                if entry is None:  # end of the initial values
                    continue
                revision = int(entry.revision or 0)
                if revision > last:
                    last = revision
                    yield (entry.value or None), revision
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()


T = TypeVar("T")


async def follow(
    kv: KeyValue,
    key: str,
    decoder: msgspec.json.Decoder[T],
    on_bad: Callable[[int, msgspec.DecodeError], None],
    *,
    check_s: float = 1.0,
) -> AsyncIterator[tuple[T | None, int]]:
    """``(value, revision)`` for the key's current value and then every update, decoded;
    ``None`` for a deleted or purged key (the follower decides what that means to it).

    A value that does not decode is handed to ``on_bad`` with its revision and skipped:
    it never ends the following (a service that stopped following would carry on, alive
    to everyone, on a value it will never see replaced), and it is never yielded as if
    the key were empty. The follower keeps what it had, and logs and counts the bad
    revision in ``on_bad``. Runs until cancelled (see :func:`watch`)."""
    async for value, revision in watch(kv, key, check_s=check_s):
        if value is None:
            yield None, revision
            continue
        try:
            decoded = decoder.decode(value)
        except msgspec.DecodeError as exc:
            on_bad(revision, exc)
            continue
        yield decoded, revision


def ignored(log: logging.Logger, what: str) -> Callable[[int, msgspec.DecodeError], None]:
    """An ``on_bad`` for :func:`follow` that logs the bad revision, as ``bad <what>
    ignored``, at ERROR: for a follower that keeps what it had and counts nothing."""

    def on_bad(revision: int, exc: msgspec.DecodeError) -> None:
        event(log, f"bad {what} ignored", logging.ERROR, revision=revision, error=str(exc))

    return on_bad


async def _revision(kv: KeyValue, key: str) -> int:
    """The key's latest revision; 0 when it has none, or when the server cannot say
    now (disconnected: the next check asks again)."""
    try:
        entry = await kv.get(key)
    except Exception:  # KeyNotFoundError, or the connection is down
        return 0
    return int(entry.revision or 0)


@dataclass(frozen=True, slots=True)
class BucketState:
    """What :func:`ensure_bucket` found or made: ``created`` False when the bucket was
    already there (its replicas and history are then its own, not those asked for)."""

    name: str
    created: bool
    replicas: int
    history: int


async def ensure_bucket(nc: Client, name: str, *, replicas: int) -> BucketState:
    """Create the bucket ``name`` with ``replicas`` and the history
    :data:`subjects.BUCKET_HISTORY` sets for it, unless it exists: an existing bucket is
    left as it is (raising its replicas is an operator's decision, see deploy/README.md).
    Only the bucket's owner may create it; anyone else's request is refused by the
    server (a permissions violation, which nats-py reports to the error callback)."""
    js = nc.jetstream()
    try:
        info = await js.stream_info(f"KV_{name}")
    except NotFoundError:
        history = subjects.BUCKET_HISTORY.get(name, 1)
        await js.create_key_value(bucket=name, history=history, replicas=replicas)
        return BucketState(name, created=True, replicas=replicas, history=history)
    return BucketState(
        name,
        created=False,
        replicas=int(info.config.num_replicas or 1),
        history=int(info.config.max_msgs_per_subject or 1),
    )
