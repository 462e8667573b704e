"""Following telemetry, however many replicas write it.

Each telemetry replica hears the heartbeats of its own intake partitions
(:func:`hecate.wire.subjects.shard_partitions`) and writes the snapshot of its own nodes
under its own key, ``snapshot.<shard>`` (:func:`hecate.wire.subjects.telemetry_key`). A
follower (a router, the gateway, ``hecate status``) watches every shard's key and merges
them: :class:`Shards` is the merge, pure; :func:`follow` and :func:`read` are the bus.

The merge takes the shards of the latest layout only: every snapshot says how many
shards wrote it (``shards``), and a follower keeps those that say what the freshest one
says, so the keys of a layout an operator changed (four replicas scaled to two) are
left out at the first snapshot of the new one. A node in two snapshots of one layout
(re-homed between replicas) is taken from the freshest. The merged snapshot's
``written_at`` is its stalest shard's: no part of it is older than that.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import msgspec
from nats.js.kv import KeyValue

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.wire import subjects
from hecate.wire.messages import NodeTelemetry, TelemetrySnapshot

_decoder = msgspec.json.Decoder(TelemetrySnapshot)


class Shards:
    """The latest snapshot of each shard's key, and their merge."""

    def __init__(self) -> None:
        self.latest: dict[str, TelemetrySnapshot] = {}

    def adopt(self, key: str, snapshot: TelemetrySnapshot | None) -> TelemetrySnapshot | None:
        """``key`` now holds ``snapshot`` (None: deleted); the merge of what is held."""
        if snapshot is None:
            self.latest.pop(key, None)
        else:
            self.latest[key] = snapshot
        return self.merged()

    def current(self) -> list[TelemetrySnapshot]:
        """The snapshots of the latest layout, oldest first."""
        if not self.latest:
            return []
        newest = max(self.latest.values(), key=lambda s: s.written_at)
        return sorted(
            (s for s in self.latest.values() if s.shards == newest.shards),
            key=lambda s: s.written_at,
        )

    def merged(self) -> TelemetrySnapshot | None:
        parts = self.current()
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        nodes: dict[str, NodeTelemetry] = {}
        for part in parts:  # oldest first: a fresher shard's word on a node wins
            nodes.update(part.nodes)
        return TelemetrySnapshot(
            written_at=parts[0].written_at,
            nodes=nodes,
            seq=sum(p.seq for p in parts),
            shards=parts[-1].shards,
        )


async def follow(
    kv: KeyValue,
    on_bad: Callable[[int, msgspec.DecodeError], None],
    *,
    check_s: float = 1.0,
) -> AsyncIterator[tuple[TelemetrySnapshot | None, TelemetrySnapshot | None]]:
    """``(merged, part)`` at every shard's snapshot as it is now and at each update:
    the merge of every shard (:class:`Shards`) and the one snapshot that just came
    (None when its key was deleted). A value that does not decode goes to ``on_bad``
    and is skipped (see :func:`hecate.bus.kv.follow`). Runs until cancelled."""
    shards = Shards()
    async for key, value, revision in kvs.watch_keys(kv, subjects.TELEMETRY_KEYS, check_s=check_s):
        part = None
        if value is not None:
            try:
                part = _decoder.decode(value)
            except msgspec.DecodeError as exc:
                on_bad(revision, exc)
                continue
        yield shards.adopt(key, part), part


async def read(kv: KeyValue, log: logging.Logger | None = None) -> TelemetrySnapshot | None:
    """The merged snapshot now (None before any telemetry replica wrote one). A shard
    whose value does not decode is left out (and logged, given ``log``)."""
    shards = Shards()
    for shard in range(subjects.INTAKE_PARTITIONS):
        key = subjects.telemetry_key(shard)
        value, _revision = await kvs.get(kv, key)
        if value is None:
            continue
        try:
            shards.adopt(key, _decoder.decode(value))
        except msgspec.DecodeError as exc:
            if log is not None:
                event(log, "bad telemetry ignored", logging.ERROR, key=key, error=str(exc))
    return shards.merged()
