"""JetStream KV helpers: create a bucket (its owner), wait for one (its readers), write
and read a value of any size (:func:`put`, :func:`get`), and watch one key's latest
value, raw (:func:`watch`) or decoded (:func:`follow`, how every service follows the
plan and the telemetry snapshot).

A value larger than :data:`PART_BYTES` (a plan or a snapshot of thousands of nodes) is
stored in parts: each part under a key of its own, ``<key>.part.<writer>.<i>``, and the
key itself holds a small head naming each part's key and revision, and the whole
value's checksum. No message then grows with the swarm past NATS's max_payload (1 MB by
default). Readers put the parts together; a head whose parts were overwritten since
(the writer wrote again meanwhile) is skipped, as a newer head follows it. Each writer
has its own part keys, so a writer that loses a compare-and-set on the head never
spoils the parts of the head that won.

Each bucket has one owner, the only service allowed to create and write it (the NATS
permissions in deploy/ enforce it): the planner owns the plan, telemetry the snapshot,
the breaker service the circuits. Readers never create a bucket; they wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from hecate.bus.logs import event
from hecate.wire import subjects

#: The largest value stored as one message; a larger one is stored in parts of this size.
PART_BYTES = 256 * 1024
#: What a head of parts starts with: never the first byte of a JSON document.
_HEAD = b"\x00parts\n"


class Parts(msgspec.Struct, frozen=True, kw_only=True):
    """The head of a value stored in parts: each part's key and revision, in order, and
    the whole value's length and SHA-256."""

    keys: tuple[str, ...]
    revisions: tuple[int, ...]
    size: int
    sha256: str


_parts = msgspec.json.Decoder(Parts)
_NOT_KEY = re.compile(r"[^-_=a-zA-Z0-9]")


async def put(kv: KeyValue, key: str, value: bytes, *, writer: str, last: int | None = None) -> int:
    """Write ``value`` under ``key``, in parts when it is larger than
    :data:`PART_BYTES`; with ``last``, as a compare-and-set on the key's revision
    (raising ``KeyWrongLastSequenceError`` as ``KeyValue.update`` does). ``writer``
    names this writer's part keys (its instance id). The key's new revision."""
    if len(value) > PART_BYTES:
        mine = f"{key}.part.{_NOT_KEY.sub('_', writer)}"
        keys = tuple(f"{mine}.{i}" for i in range(-(-len(value) // PART_BYTES)))
        revisions = []
        for i, part_key in enumerate(keys):
            part = value[i * PART_BYTES : (i + 1) * PART_BYTES]
            revisions.append(int(await kv.put(part_key, part)))
        head = Parts(
            keys=keys,
            revisions=tuple(revisions),
            size=len(value),
            sha256=hashlib.sha256(value).hexdigest(),
        )
        value = _HEAD + msgspec.json.encode(head)
    if last is None:
        return int(await kv.put(key, value))
    return int(await kv.update(key, value, last=last))


async def whole(kv: KeyValue, value: bytes) -> bytes | None:
    """``value`` as stored under a key: itself, or, for a head of parts, the parts put
    together; None when a part is gone or changed since the head was written (its
    writer wrote again: a newer head is there to read)."""
    if not value.startswith(_HEAD):
        return value
    try:
        head = _parts.decode(value[len(_HEAD) :])
    except msgspec.DecodeError:
        return value  # not a head after all: the reader's decoder says what it is
    chunks = []
    for part_key, revision in zip(head.keys, head.revisions, strict=True):
        try:
            entry = await kv.get(part_key, revision=revision)
        except KeyNotFoundError:
            return None
        chunks.append(entry.value or b"")
    out = b"".join(chunks)
    if len(out) != head.size or hashlib.sha256(out).hexdigest() != head.sha256:
        return None
    return out


async def get(kv: KeyValue, key: str) -> tuple[bytes | None, int]:
    """The key's whole value now (parts put together) and its revision; ``(None, 0)``
    when it has none, ``(None, revision)`` when it is deleted. Raises what the server
    says when it cannot answer (disconnected, timed out)."""
    for _ in range(3):  # a head whose parts moved on: read the newer one
        try:
            entry = await kv.get(key)
        except KeyNotFoundError as exc:
            return None, int(getattr(exc.entry, "revision", 0) or 0)
        revision = int(entry.revision or 0)
        if not entry.value:
            return None, revision
        value = await whole(kv, entry.value)
        if value is not None:
            return value, revision
    return None, 0


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


async def find_bucket(nc: Client, name: str) -> KeyValue | None:
    """The bucket ``name``, or None when it is not there yet (or the server cannot say
    now): one look, for a reader that has something better to wait on than polling."""
    try:
        found = await nc.jetstream().key_value(name)
    except Exception:
        found = None
    still_cancelled()
    return found


async def wait_bucket(nc: Client, name: str, *, poll_s: float = 0.2) -> KeyValue:
    """The bucket ``name`` once its owner has created it (polled; cancel to give up).
    Run it in a background task: a reader must not wait for another service to start."""
    # Not created yet, or disconnected or timed out (the client reconnects on its own):
    # ask again.
    while (found := await find_bucket(nc, name)) is None:
        await asyncio.sleep(poll_s)
    return found


async def watch(
    kv: KeyValue, key: str, *, check_s: float = 1.0
) -> AsyncIterator[tuple[bytes | None, int]]:
    """``(value, revision)`` for the key's current value (if any) and then every update
    (:func:`watch_keys` of one key)."""
    async for _key, value, revision in watch_keys(kv, key, check_s=check_s):
        yield value, revision


async def watch_keys(
    kv: KeyValue, pattern: str, *, check_s: float = 1.0
) -> AsyncIterator[tuple[str, bytes | None, int]]:
    """``(key, value, revision)`` for the current value of every key ``pattern``
    matches (a key, or one with ``*`` wildcards) and then every update.

    A deleted or purged key yields ``(key, None, revision)``; a value stored in parts is
    yielded whole. Runs until cancelled.

    nats-py's watcher is an ordered consumer the server holds in memory: a server
    restarted (or a reconnect to another) forgets it, and nats-py then waits in silence
    for updates that never come. So after ``check_s`` without one, the revisions of the
    keys already seen (of the key itself, for a plain key) are read directly. A newer
    one than the last yielded means the watcher went deaf: a fresh one takes over from
    the current values, and what was already yielded is not yielded again. An older one
    means the bucket itself started over (a server with a fresh store): everything it
    holds is new. A pattern none of whose keys has been seen yet is watched afresh at
    each check: nothing else would tell a deaf watcher from a quiet bucket."""
    last: dict[str, int] = {}
    plain = "*" not in pattern and ">" not in pattern
    while True:
        watcher = await kv.watch(pattern)
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
                    known = [pattern] if plain else list(last)
                    if not known:
                        break
                    now = {k: await _revision(kv, k) for k in known}
                    still_cancelled()
                    if any(0 < r < last.get(k, 0) for k, r in now.items()):
                        last.clear()  # the bucket started over
                        break
                    if any(r > last.get(k, 0) for k, r in now.items()):
                        break
                    continue
                if entry is None:  # end of the initial values
                    continue
                revision = int(entry.revision or 0)
                if revision <= last.get(entry.key, 0):
                    continue
                value = await whole(kv, entry.value) if entry.value else None
                if entry.value and value is None:
                    continue  # its parts moved on: a newer head follows
                last[entry.key] = revision
                yield entry.key, value, revision
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
