"""JetStream KV helpers: create a bucket (its owner), wait for one (its readers), and
watch one key's latest value.

Each bucket has one owner, the only service allowed to create and write it (the NATS
permissions in deploy/ enforce it): the planner owns the plan, telemetry the snapshot,
the breaker service the circuits. Readers never create a bucket; they wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

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


async def wait_bucket(nc: Client, name: str, *, poll_s: float = 0.2) -> KeyValue:
    """The bucket ``name`` once its owner has created it (polled; cancel to give up).
    Run it in a background task: a reader must not wait for another service to start."""
    js = nc.jetstream()
    while True:
        # Not created yet, or disconnected or timed out (the client reconnects on its
        # own): ask again.
        with contextlib.suppress(Exception):
            return await js.key_value(name)
        await asyncio.sleep(poll_s)


async def watch(kv: KeyValue, key: str) -> AsyncIterator[tuple[bytes | None, int]]:
    """``(value, revision)`` for the current value (if any) and then every update.

    A deleted or purged key yields ``(None, revision)``. Runs until cancelled.
    """
    watcher = await kv.watch(key)
    try:
        async for entry in watcher:
            if entry is None:  # end of the initial values
                continue
            yield (entry.value or None), int(entry.revision or 0)
    finally:
        await watcher.stop()


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
