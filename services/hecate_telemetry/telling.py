"""What a telemetry replica tells its followers: a snapshot now and then, deltas between.

Every heartbeat moves a node's figures and its ``last_seen``, so a snapshot rewritten
at every change is every node's entry sent to every router ten times a second: at a
thousand nodes, 800 KB a second a router, for figures that mostly held. Instead, each
write is a :class:`~hecate.wire.messages.TelemetryDelta` on the replica's subject,
numbered (``seq``, following ``base``) in one sequence per replica start (``epoch``):

- the whole entry of each node whose figures moved past :class:`Tolerance` since it
  was last told (what a follower holds is never further than that from the truth);
- the whole entry of each node that went up or down, or started or stopped draining,
  since the latest snapshot (``flipped``): a follower that missed a delta has every
  node's liveness right again at the next one;
- for the other nodes heard since the last delta, only when (``heard``).

A snapshot of the whole state is written to KV as well (a keyframe), after a delta and
numbered as it, so that a follower starting, or one that missed a delta, has something
to stand on: at most every ``keyframe_min_s``, and no more bytes a second than
``keyframe_bytes_s`` on average (a swarm of ten thousand nodes writes its 1.3 MB every
ten seconds), unless more than ``flips_cap`` nodes flipped since the last one (a rack
lost or joined: one snapshot tells it cheaper than every delta repeating it). A
follower in step reads none of them.

Pure: the service hands it the time, the nodes heard and a way to read an entry; it
hands back bytes to publish and to put.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass

import msgspec

from hecate.wire.messages import NodeTelemetry, TelemetryDelta, TelemetrySnapshot

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far a figure may move before followers are told: ``relative`` of its told
    value, and never less than the figure's own floor (so that a figure near zero is
    not re-sent at every wobble). ``in_flight``, liveness and draining: any change."""

    relative: float = 0.1
    latency_ms: float = 1.0
    load: float = 0.05
    score: float = 0.05
    memory_used: float = 64 * 2**20  # bytes


def moved(told: NodeTelemetry, now: NodeTelemetry, tol: Tolerance) -> bool:
    """Whether a follower holding ``told`` must be told ``now``."""
    if told.alive != now.alive or told.draining != now.draining or told.in_flight != now.in_flight:
        return True
    for was, new, floor in (
        (told.latency_ms, now.latency_ms, tol.latency_ms),
        (told.load, now.load, tol.load),
        (told.score, now.score, tol.score),
        (told.memory_used, now.memory_used, tol.memory_used),
    ):
        if (was is None) != (new is None):
            return True
        if (
            was is not None
            and new is not None
            and abs(new - was) > max(floor, tol.relative * abs(was))
        ):
            return True
    return False


def flipped(told: NodeTelemetry | None, now: NodeTelemetry) -> bool:
    """Whether a node went up or down, or started or stopped draining."""
    return told is None or told.alive != now.alive or told.draining != now.draining


@dataclass(frozen=True, slots=True)
class Writes:
    """What one write tick sends: a delta to publish, a snapshot to put (either may be
    missing)."""

    delta: bytes | None
    keyframe: bytes | None
    seq: int  # the delta's, and the snapshot's: the state after it


class Teller:
    """One replica's sequence of deltas and snapshots (see the module's doc)."""

    def __init__(
        self,
        *,
        shard: int,
        shards: int,
        epoch: float,
        tolerance: Tolerance | None = None,
        keyframe_min_s: float = 1.0,
        keyframe_bytes_s: float = 128 * 1024,
        flips_cap: int = 64,
    ) -> None:
        self.shard, self.shards, self.epoch = shard, shards, epoch
        self.tolerance = tolerance or Tolerance()
        self.keyframe_min_s = keyframe_min_s
        self.keyframe_bytes_s = keyframe_bytes_s
        self.flips_cap = flips_cap
        self.told: dict[str, NodeTelemetry] = {}  # what a follower in step holds
        self.flipped: set[str] = set()  # since the latest snapshot
        self.changed: set[str] = set()  # heard or judged since the last write
        self.seq = 0
        self.keyframe = 0  # the latest snapshot's seq
        self.keyframe_at = -math.inf
        self.keyframe_size = 0
        self.keyframes = 0

    def touch(self, node_id: str) -> None:
        """``node_id`` was heard, or judged up or down: the next write looks at it."""
        self.changed.add(node_id)

    def write(
        self,
        now: float,
        wall: float,
        entry: Callable[[str], NodeTelemetry],
        everyone: Collection[str],
    ) -> Writes:
        """This tick's delta (None when nothing changed) and, when one is due, the
        snapshot of ``everyone`` after it. ``now``: monotonic; ``wall``: stamped."""
        nodes: dict[str, NodeTelemetry] = {}
        heard: dict[str, float] = {}
        for node_id in self.changed:
            new = entry(node_id)
            was = self.told.get(node_id)
            if flipped(was, new):
                self.flipped.add(node_id)
            if was is None or node_id in self.flipped or moved(was, new, self.tolerance):
                nodes[node_id] = self.told[node_id] = new
            elif new.last_seen is not None:
                heard[node_id] = new.last_seen
        for node_id in self.flipped - nodes.keys():  # every flip since the snapshot, again
            nodes[node_id] = self.told[node_id]
        self.changed.clear()
        delta = None
        if nodes or heard:
            self.seq += 1
            delta = _encode(
                TelemetryDelta(
                    written_at=wall,
                    epoch=self.epoch,
                    seq=self.seq,
                    base=self.seq - 1,
                    keyframe=self.keyframe,
                    nodes=nodes,
                    heard=heard,
                    shard=self.shard,
                    shards=self.shards,
                )
            )
        keyframe = None
        if self.due(now):
            keyframe = _encode(self.snapshot(wall, entry, everyone))
        return Writes(delta, keyframe, self.seq)

    def kept(self, writes: Writes, now: float) -> None:
        """``writes``' snapshot is in KV: the deltas after it name it, and the flips
        before it are no longer repeated. (One that could not be put is not kept: the
        deltas go on naming the one before, and the next tick tries again.)"""
        assert writes.keyframe is not None
        self.keyframe, self.keyframe_at = writes.seq, now
        self.keyframe_size = len(writes.keyframe)
        self.keyframes += 1
        self.flipped.clear()

    def due(self, now: float) -> bool:
        """Whether a snapshot is written this tick."""
        if self.keyframes == 0 or len(self.flipped) > self.flips_cap:
            return True
        return now >= self.next_keyframe()

    def next_keyframe(self) -> float:
        """When the next snapshot may be written (monotonic)."""
        every = max(self.keyframe_min_s, self.keyframe_size / self.keyframe_bytes_s)
        return self.keyframe_at + every

    def owed(self, now: float) -> float | None:
        """How long until a snapshot is owed although nothing else changes: the deltas
        since the latest one are not in KV yet (a swarm gone quiet after a change would
        otherwise leave followers starting later to that stale one). None: owed none."""
        if self.seq == self.keyframe and self.keyframes > 0:
            return None
        return max(0.0, self.next_keyframe() - now)

    def snapshot(
        self, wall: float, entry: Callable[[str], NodeTelemetry], everyone: Collection[str]
    ) -> TelemetrySnapshot:
        """The whole state, as of the latest delta (numbered as it): each node as its
        followers were last told it (its ``last_seen`` the latest), not as it is now. A
        follower that adopts it then holds what one in step holds, so the deltas after
        it, which send a figure only once it moves past the tolerance of what was told,
        keep both within the tolerance of the truth: a snapshot of the truth itself left
        an adopter there, and a later move back toward what was told never reached it."""
        return TelemetrySnapshot(
            written_at=wall,
            nodes={i: self._as_told(i, entry(i)) for i in sorted(everyone)},
            seq=self.seq,
            shard=self.shard,
            shards=self.shards,
            epoch=self.epoch,
        )

    def _as_told(self, node_id: str, now: NodeTelemetry) -> NodeTelemetry:
        told = self.told.get(node_id)
        if told is None:
            return now
        return msgspec.structs.replace(told, last_seen=now.last_seen)
