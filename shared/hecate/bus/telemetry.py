"""Following telemetry, however many replicas write it.

Each telemetry replica hears the heartbeats of its own intake partitions
(:func:`hecate.wire.subjects.shard_partitions`) and tells what changed among its nodes
on its own subject, ``hecate.telemetry.delta.<shard>``, numbered in one sequence per
replica start; now and then it puts the snapshot of them all in KV, under
``snapshot.<shard>``, numbered as the delta it follows (see
:mod:`hecate_telemetry.telling` for what a delta holds). A follower (a router, the
gateway, ``hecate status``) reads the snapshots when it starts, then applies deltas;
when one is missing (a delta that did not arrive, a replica restarted) it goes on
applying what comes, whole entries, every node's liveness right again at the next
delta, and reads the shard's snapshot again once one newer than what it missed is
out. A follower in step reads no snapshot: what it receives grows with what changes,
not with the swarm. :class:`Shards` is the follower's state, pure; :func:`follow` and
:func:`read` are the bus.

The merge takes the shards of the latest layout only: every message says how many
shards wrote it (``shards``), and a follower keeps those that say what the freshest one
says, so the shards of a layout an operator changed (four replicas scaled to two) are
left out once the new one speaks. A node in two shards of one layout (re-homed between
replicas) is taken from the freshest. The merged snapshot's ``written_at`` is its
stalest shard's: no part of it is older than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client
from nats.js.kv import KeyValue

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.wire import subjects
from hecate.wire.messages import NodeTelemetry, TelemetryDelta, TelemetrySnapshot

_snapshot = msgspec.json.Decoder(TelemetrySnapshot)
_delta = msgspec.json.Decoder(TelemetryDelta)


@dataclass(slots=True)
class Held:
    """What a follower holds of one shard: its nodes as of message ``seq`` of
    ``epoch``, and the first message it missed since its latest snapshot (None: in
    step)."""

    epoch: float
    seq: int
    written_at: float
    shards: int
    nodes: dict[str, NodeTelemetry]
    missed: int | None = None
    applied: int = 0  # deltas applied since its snapshot


@dataclass(slots=True)
class Following:
    """What following has cost and found, for a follower's figures."""

    deltas: int = 0
    delta_bytes: int = 0
    snapshots: int = 0  # read from KV
    snapshot_bytes: int = 0
    gaps: int = 0  # deltas that did not follow the one before
    stale: int = 0  # messages older than what was held, left out
    bad: int = 0


class Shards:
    """Every shard's nodes as a follower holds them, and their merge."""

    def __init__(self) -> None:
        self.held: dict[int, Held] = {}
        self.stats = Following()

    # -- snapshots -------------------------------------------------------------------------

    def adopt(self, snapshot: TelemetrySnapshot) -> TelemetrySnapshot | None:
        """A shard's snapshot, read from KV: taken unless what is held is newer and
        whole; the merge when taken."""
        held = self.held.get(snapshot.shard)
        if held is not None and held.epoch == snapshot.epoch:
            if snapshot.seq < (held.missed if held.missed is not None else held.seq):
                self.stats.stale += 1
                return None
        elif held is not None and snapshot.epoch < held.epoch:
            self.stats.stale += 1
            return None
        self.held[snapshot.shard] = Held(
            epoch=snapshot.epoch,
            seq=snapshot.seq,
            written_at=snapshot.written_at,
            shards=snapshot.shards,
            nodes=dict(snapshot.nodes),
        )
        return self.merged()

    def wants_snapshot(self, delta: TelemetryDelta) -> bool:
        """Whether ``delta``'s shard should be read from KV before ``delta`` is applied:
        the follower missed something that a snapshot out now covers."""
        held = self.held.get(delta.shard)
        if held is None or held.epoch != delta.epoch:
            return delta.base > 0  # a replica past its first delta: it has put one
        missed = held.missed
        if missed is None and delta.base > held.seq:
            missed = held.seq + 1
        return missed is not None and delta.keyframe >= missed

    # -- deltas ----------------------------------------------------------------------------

    def apply(self, delta: TelemetryDelta) -> tuple[TelemetrySnapshot, TelemetrySnapshot] | None:
        """``(merged, part)`` after ``delta``: the merge, and the entries it changed
        (a heard node's with its new ``last_seen``); None when it was left out (no
        newer than what is held)."""
        held = self.held.get(delta.shard)
        if held is None or held.epoch != delta.epoch:
            if held is not None and delta.epoch < held.epoch:
                self.stats.stale += 1
                return None
            held = self.held[delta.shard] = Held(
                epoch=delta.epoch, seq=0, written_at=delta.written_at, shards=delta.shards, nodes={}
            )
        if delta.seq <= held.seq:
            self.stats.stale += 1
            return None
        if delta.base != held.seq:
            self.stats.gaps += 1
            if held.missed is None:
                held.missed = held.seq + 1
        changed = dict(delta.nodes)
        for node_id, when in delta.heard.items():
            was = held.nodes.get(node_id)
            if was is not None:
                changed[node_id] = msgspec.structs.replace(was, last_seen=when)
        held.nodes.update(changed)
        held.seq, held.written_at, held.shards = delta.seq, delta.written_at, delta.shards
        held.applied += 1
        part = TelemetrySnapshot(
            written_at=delta.written_at,
            nodes=changed,
            seq=delta.seq,
            shard=delta.shard,
            shards=delta.shards,
            epoch=delta.epoch,
        )
        merged = self.merged()
        assert merged is not None  # this shard is held
        return merged, part

    # -- the merge ---------------------------------------------------------------------------

    def current(self) -> list[Held]:
        """The shards of the latest layout, oldest first."""
        if not self.held:
            return []
        newest = max(self.held.values(), key=lambda h: h.written_at)
        return sorted(
            (h for h in self.held.values() if h.shards == newest.shards),
            key=lambda h: h.written_at,
        )

    def merged(self) -> TelemetrySnapshot | None:
        parts = self.current()
        if not parts:
            return None
        nodes: dict[str, NodeTelemetry] = {}
        for part in parts:  # oldest first: a fresher shard's word on a node wins
            nodes.update(part.nodes)
        return TelemetrySnapshot(
            written_at=parts[0].written_at,
            nodes=nodes,
            seq=sum(p.seq for p in parts),
            shards=parts[-1].shards,
        )


async def _snapshots(
    kv: KeyValue, shards: Shards, only: int | None = None, log: logging.Logger | None = None
) -> TelemetrySnapshot | None:
    """Read every shard's snapshot from KV (or shard ``only``'s) into ``shards``; the
    merge after the last one taken."""
    merged = None
    for shard in range(subjects.INTAKE_PARTITIONS) if only is None else (only,):
        key = subjects.telemetry_key(shard)
        value, _revision = await kvs.get(kv, key)
        if value is None:
            continue
        shards.stats.snapshots += 1
        shards.stats.snapshot_bytes += len(value)
        try:
            snapshot = _snapshot.decode(value)
        except msgspec.DecodeError as exc:
            shards.stats.bad += 1
            if log is not None:
                event(log, "bad telemetry ignored", logging.ERROR, key=key, error=str(exc))
            continue
        merged = shards.adopt(snapshot) or merged
    return merged


async def follow(
    nc: Client,
    kv: KeyValue,
    on_bad: Callable[[int, msgspec.DecodeError], None],
    *,
    shards: Shards | None = None,
    log: logging.Logger | None = None,
) -> AsyncGenerator[tuple[TelemetrySnapshot | None, TelemetrySnapshot | None]]:
    """``(merged, part)``: first the merge of every shard's snapshot (part None), then
    after each delta the merge and the entries it changed. A delta that does not
    decode goes to ``on_bad`` (with 0: it has no revision) and is skipped; a shard's
    snapshot is read again when one covers what was missed (see the module's doc).
    A snapshot the server cannot give now is tried again at the next delta. Runs
    until cancelled."""
    shards = shards if shards is not None else Shards()
    stats = shards.stats
    sub = await nc.subscribe(subjects.TELEMETRY_DELTAS, pending_msgs_limit=65536)
    try:
        yield await _snapshots(kv, shards, log=log), None
        async for msg in sub.messages:
            stats.deltas += 1
            stats.delta_bytes += len(msg.data)
            try:
                delta = _delta.decode(msg.data)
            except msgspec.DecodeError as exc:
                stats.bad += 1
                on_bad(0, exc)
                continue
            if shards.wants_snapshot(delta):
                try:
                    await _snapshots(kv, shards, delta.shard, log)
                except Exception as exc:  # server away: the next delta tries again
                    if log is not None:
                        event(log, "telemetry snapshot not read", logging.WARNING, error=repr(exc))
            step = shards.apply(delta)
            if step is not None:
                yield step
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def read(
    kv: KeyValue,
    log: logging.Logger | None = None,
    *,
    nc: Client | None = None,
    listen_s: float = 0.0,
) -> TelemetrySnapshot | None:
    """The merged snapshot now (None before any telemetry replica wrote one): every
    shard's from KV and, given ``nc`` and ``listen_s``, the deltas heard for that long
    after (each brings every node's liveness up to date). A shard whose value does not
    decode is left out (and logged, given ``log``)."""
    shards = Shards()
    if nc is None or listen_s <= 0:
        return await _snapshots(kv, shards, log=log)
    merged = None
    sub = await nc.subscribe(subjects.TELEMETRY_DELTAS)
    try:
        merged = await _snapshots(kv, shards, log=log)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(listen_s):
                async for msg in sub.messages:
                    try:
                        step = shards.apply(_delta.decode(msg.data))
                    except msgspec.DecodeError:
                        continue
                    if step is not None:
                        merged = step[0]
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return merged
