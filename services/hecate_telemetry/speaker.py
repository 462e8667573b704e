"""What a telemetry replica says, and whether it may say it.

Replicas of one shard share a lease in KV (``lease.<shard>``, :mod:`.lease`): the holder
alone speaks. It says each liveness change on ``hecate.events.node.down`` / ``.up`` at
once, what moved among its nodes on ``hecate.telemetry.delta.<shard>`` (at once after a
liveness change, otherwise at most once per ``publish_s``), and now and then the whole
snapshot in KV (:mod:`.telling` decides which and when). A standby judges as the holder
does but keeps its liveness changes for a term or two, and says them if it takes over
(its predecessor may have died before saying them) or, holding the lease still, when its
own loop was held past its term.

The judging (heartbeats, the failure detector) is the service's; it hands this each
change through :meth:`Speaker.touch` and :meth:`Speaker.liveness`, and this reads a
node's entry through the ``entry`` it was built with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection

import msgspec
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.bus.service import Service, encode
from hecate.wire import subjects
from hecate.wire.messages import NodeEvent, NodeTelemetry, TelemetryLease
from hecate_telemetry.config import TelemetryConfig
from hecate_telemetry.lease import Claim, Lease
from hecate_telemetry.telling import Teller, Tolerance

__all__ = ["Speaker"]

_lease = msgspec.json.Decoder(TelemetryLease)


class Speaker:
    def __init__(
        self,
        config: TelemetryConfig,
        service: Service,
        *,
        entry: Callable[[str], NodeTelemetry],
        nodes: Collection[str],
        log: logging.Logger,
    ) -> None:
        """``entry``: what followers are told of a node now; ``nodes``: every node the
        replica holds (a live view: read at each write)."""
        self.config = config
        self.service = service
        self.log = log
        self._entry = entry
        self._nodes = nodes
        self.lease = Lease(config.instance_id, config.lease_s)
        self.teller = self._teller(0.0)  # speaks once it holds the lease, in its epoch
        self.deltas = self.delta_bytes = self.keyframe_bytes = 0
        # Liveness changes judged while a standby, kept for a term or two: said at once
        # if this replica takes over.
        self._unsaid: dict[str, NodeEvent] = {}
        self._dirty = asyncio.Event()
        self._urgent = False
        self._urgent_event = asyncio.Event()
        self._kv: KeyValue | None = None

    async def start(self, kv: KeyValue) -> None:
        """Read the lease once: a replica alone for its shard speaks from the start."""
        self._kv = kv
        await self._lease_once()

    def touch(self, node_id: str) -> None:
        """``node_id``'s figures moved: told at the next write."""
        self.teller.touch(node_id)
        self._dirty.set()

    async def liveness(self, news: NodeEvent) -> None:
        """A liveness change, said at once while this replica speaks, kept if not."""
        if self.lease.holding(news.at):
            event(self.log, f"node {news.state}", node_id=news.node_id, reason=news.reason)
            await self._say(news)
        else:
            self._unsaid[news.node_id] = news
        self.teller.touch(news.node_id)
        self._wake(urgent=True)

    def figures(self) -> dict[str, object]:
        return {
            "deltas": self.deltas,
            "delta_bytes": self.delta_bytes,
            "keyframes": self.teller.keyframes,
            "keyframe_bytes": self.keyframe_bytes,
            "holding": self.lease.holding(time.time()),
            "lease_holder": self.lease.holder,
            "takeovers": self.lease.takeovers,
        }

    def _wake(self, *, urgent: bool) -> None:
        if urgent:
            self._urgent = True
        self._urgent_event.set()
        self._dirty.set()

    async def _say(self, news: NodeEvent) -> None:
        subject = subjects.EVENT_NODE_UP if news.state == "up" else subjects.EVENT_NODE_DOWN
        await self.service.nc.publish(subject, encode(news))

    # -- the lease: which replica of the shard speaks ----------------------------------

    def _teller(self, epoch: float) -> Teller:
        c = self.config
        return Teller(
            shard=c.shard,
            shards=c.shards,
            epoch=epoch,
            tolerance=Tolerance(relative=c.tolerance),
            keyframe_min_s=c.keyframe_min_s,
            keyframe_bytes_s=c.keyframe_bytes_s,
            flips_cap=c.flips_cap,
        )

    async def leasing(self) -> None:
        """Renew, take over or stand by, every third of a term."""
        while True:
            await asyncio.sleep(self.config.lease_s / 3)
            await self._lease_once()

    async def _lease_once(self) -> None:
        """Read the shard's lease, and renew it, take it over or stand by."""
        assert self._kv is not None, "leased before start"
        key = subjects.telemetry_lease_key(self.config.shard)
        try:
            value, revision = await kvs.get(self._kv, key)
        except Exception as exc:  # the bus away: our term runs out on its own
            event(self.log, "lease not read", logging.WARNING, error=repr(exc))
            return
        read = None
        if value is not None:
            with contextlib.suppress(msgspec.DecodeError):  # unreadable: taken over
                read = _lease.decode(value)
        now = time.time()
        lapsed = self.lease.epoch > 0 and not self.lease.holding(now)
        claim = self.lease.claim(now, read, revision)
        if claim is None:
            horizon = now - 2 * self.config.lease_s
            self._unsaid = {n: e for n, e in self._unsaid.items() if e.at >= horizon}
            return
        try:
            await self._write_lease(self._kv, key, claim)
        except KeyWrongLastSequenceError:  # another replica wrote first
            self.lease.lost()
            return
        except Exception as exc:  # the bus away: our term runs out on its own
            event(self.log, "lease not written", logging.WARNING, error=repr(exc))
            return
        if self.lease.won(claim):
            await self._speak_afresh(read)
            return
        if lapsed:  # ours still, but this loop was held past its term: silent meanwhile
            event(
                self.log,
                "lease renewed after its term ran out: what was judged meanwhile is said now",
                logging.WARNING,
                unsaid=len(self._unsaid),
            )
            self._wake(urgent=False)
        await self._say_unsaid()

    async def _say_unsaid(self) -> None:
        """Say the liveness changes judged while this replica could not speak."""
        unsaid, self._unsaid = self._unsaid, {}
        for news in unsaid.values():
            event(self.log, f"node {news.state}", node_id=news.node_id, reason=news.reason)
            await self._say(news)

    @staticmethod
    async def _write_lease(kv: KeyValue, key: str, claim: Claim) -> None:
        data = encode(claim.value)
        if claim.how == "create":
            await kv.create(key, data)
        else:
            await kv.update(key, data, last=claim.last)

    async def _speak_afresh(self, before: TelemetryLease | None) -> None:
        """This replica now speaks for the shard, in a new epoch: everything it knows is
        told afresh, and the liveness changes it judged while standing by are said."""
        event(
            self.log,
            "telemetry speaks for its shard",
            shard=self.config.shard,
            epoch=self.lease.epoch,
            took_over_from=before.holder if before is not None else None,
        )
        self.teller = self._teller(self.lease.epoch)
        for node_id in self._nodes:
            self.teller.touch(node_id)
        await self._say_unsaid()
        self._wake(urgent=True)

    # -- output ------------------------------------------------------------------------

    async def writer(self) -> None:
        """Deltas and snapshots, while this replica speaks."""
        assert self._kv is not None, "written before start"
        shard = self.config.shard
        while True:
            # Only the replica that speaks owes a snapshot; a standby waits for news (a
            # takeover or a renewal wakes it), and says nothing until it speaks.
            speaking = self.lease.holding(time.time())
            owed = self.teller.owed(time.monotonic()) if speaking else None
            with contextlib.suppress(TimeoutError):  # past it: the snapshot owed
                await asyncio.wait_for(self._dirty.wait(), owed)
            self._dirty.clear()
            if not self.lease.holding(time.time()):
                continue
            urgent, self._urgent = self._urgent, False
            writes = self.teller.write(time.monotonic(), time.time(), self._entry, self._nodes)
            try:
                if writes.delta is not None:
                    await self.service.nc.publish(subjects.telemetry_delta(shard), writes.delta)
                    self.deltas += 1
                    self.delta_bytes += len(writes.delta)
                if writes.keyframe is not None:
                    key = subjects.telemetry_key(shard)
                    await kvs.put(self._kv, key, writes.keyframe, writer=self.service.instance_id)
                    self.teller.kept(writes, time.monotonic())
                    self.keyframe_bytes += len(writes.keyframe)
            except Exception as exc:  # server away: followers catch up from the next snapshot
                event(self.log, "telemetry not written", logging.WARNING, error=repr(exc))
                self._dirty.set()
            if not urgent:  # coalesce routine updates, but never delay a liveness change
                self._urgent_event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent_event.wait(), self.config.publish_s)
