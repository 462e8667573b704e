"""telemetry: heartbeats in, EWMA state and liveness out.

Listens: its heartbeat intake partitions, ``hecate.telemetry.intake.<p>.*`` (Heartbeat:
the server maps each node's ``hecate.telemetry.heartbeat.<id>`` to one partition by a
hash of the id; a replica takes the partitions ``p % shards == shard``, all of them when
it is alone), and ``hecate.node.*.leave``, each taken only when the node its subject
names is the node its body names (:mod:`hecate.bus.vouching`: a node cannot fake
another's liveness or its leaving). Several replicas thus share the heartbeats of a
large swarm, each judging its own nodes; a node's beats always reach the same one.
Holds: per node, the core's :class:`NodeState` (EWMA of latency, load, score) and its
heartbeat history in a :class:`FailureDetector` (monotonic clock).
Decides: a node is down when the detector suspects it: when its silence is unlikely
given how its own heartbeats have been arriving (phi accrual). A node that heartbeated
like clockwork every 100 ms is down 0.48 s after its last heartbeat (plus at most half an
interval until the next sweep); one whose heartbeats came 200-400 ms apart under load
is given 0.58-0.78 s; none is given more than 5 s. ``missed`` intervals of silence are
always allowed. A node whose beats say it is loading its ranges is given 10 s instead
(``loading_silence_s``): its loader may hold its interpreter, its beats with it. A node
is up again at its next beat, with a fresh history.
Publishes (through :mod:`.speaker`, while this replica holds its shard's lease):
``hecate.events.node.down`` / ``.up``; what changed among its nodes on
``hecate.telemetry.delta.<shard>`` (on every liveness change at once, otherwise at most
once per ``publish_s``), and now and then the snapshot of them all in KV
``hecate-telemetry/snapshot.<shard>``, for followers starting or catching up
(:mod:`hecate_telemetry.telling`). ``$SRV.STATS`` shows, on the heartbeat endpoint,
each node's ``patience_ms`` (the silence it would be declared down after), the nodes
``loading``, this service's own ``stalls`` and ``deaf_sweeps``, and what it told.

Silence this service did not watch is not held against anyone: when its sweep wakes
more than a period late (its own event loop was descheduled or blocked), the lateness
is taken out of every node's silence, and nobody is declared down on that pass, so the
heartbeats that queued meanwhile are read first. Nor is silence it could not hear:
every silence is measured up to the last moment its own link proved it works
(:class:`hecate_telemetry.liveness.Link`), first proven by the PING that made it ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from typing import Literal

import msgspec
from nats.aio.client import Client
from opentelemetry.trace import TracerProvider

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.bus.service import Service
from hecate.bus.vouching import NodeIdentity
from hecate.core.telemetry import NodeState, Sample, observe
from hecate.wire import subjects
from hecate.wire.messages import (
    Heartbeat,
    NodeEvent,
    NodeLeave,
    NodeTelemetry,
)
from hecate_telemetry.config import TelemetryConfig
from hecate_telemetry.liveness import FailureDetector, Link, LinkNews
from hecate_telemetry.speaker import Speaker

# nats-py's own wait for a PONG: never reached on a live connection, whose pings call a
# held link stale (and replace it, dropping the PING) well before.
PING_TIMEOUT_S = 120


def _quietly(task: asyncio.Future[None]) -> None:
    """A PING of a connection that closed raises: that is not news here."""
    if not task.cancelled():
        task.exception()


class Telemetry:
    def __init__(
        self,
        config: TelemetryConfig | None = None,
        *,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.config = config = config or TelemetryConfig()
        self.detector = FailureDetector(config.detector())
        self.sweeps = 0  # passes that judged every node
        self.stalls = 0  # sweeps that woke so late that this service was not watching
        self.blind_s = 0.0
        self.link: Link | None = None  # the inbound link's proof, once it is ready
        self._probe: asyncio.Future[None] | None = None  # the PING out on the inbound link
        self._probe_sent = 0.0
        self.alpha = config.alpha
        self.log = log
        self.service = Service(
            kind="telemetry",
            name=subjects.SERVICE_NAMES["telemetry"],
            instance_id=config.instance_id,
            description="node heartbeats -> EWMA telemetry, liveness, snapshot in KV",
            log=log,
            tracer_provider=tracer_provider,
        )
        self.nodes: dict[str, NodeState] = {}
        self.interval: dict[str, float] = {}  # declared heartbeat interval, seconds
        self.draining: dict[str, bool] = {}
        self.memory: dict[str, int] = {}  # each node's memory in use, as last beaten
        self.wall: dict[str, float] = {}  # wall time of the last heartbeat, for the snapshot
        # Which replica of the shard speaks, and what it says (deltas, snapshots, news).
        self.speaker = Speaker(config, self.service, entry=self.entry, nodes=self.nodes, log=log)
        self.rejected = 0
        self.identity = NodeIdentity(log)
        self.partitions = subjects.shard_partitions(config.shard, config.shards)
        self.unmapped = 0  # beats heard on the unmapped subject (a server without mappings)
        # Each node numbers its beats: a gap is beats sent and never heard (dropped on
        # the way, or lost while the node was cut off).
        self.last_seq: dict[str, int] = {}
        self.beats_missed = 0

    async def run(self, url: str, stop: asyncio.Event) -> None:
        svc = self.service
        await svc.start(url)
        # Fire-and-forget subjects: the shell decodes, counts and logs bad messages once.
        guard = self.identity.guard
        for name, subject in self._intake():
            beats = await svc.add_endpoint(
                name,
                subject,
                Heartbeat,
                guard(self._on_heartbeat, lambda beat: beat.node_id),
                traced=False,
                deferred=True,
            )
            if name == "heartbeat":
                beats.status = self.figures
        # A server without the partition mapping delivers every beat unmapped, to every
        # replica: each takes the nodes a partition of its own would have brought it.
        await svc.add_endpoint(
            "heartbeat-unmapped",
            subjects.HEARTBEAT_ALL,
            Heartbeat,
            guard(self._on_unmapped, lambda beat: beat.node_id),
            traced=False,
            deferred=True,
        )
        await svc.add_endpoint(
            "leave",
            subjects.NODE_LEAVE_ALL,
            NodeLeave,
            guard(self._on_leave, lambda leave: leave.node_id),
            deferred=True,
        )
        await self.speaker.start(await kvs.bucket(svc.nc, subjects.TELEMETRY_BUCKET))
        svc.spawn(self.speaker.leasing())
        pinged = time.monotonic()
        await svc.ready()  # a PING on the inbound link, answered: its first proof
        self.link = Link(proven_at=pinged)
        svc.spawn(self._sweep())
        svc.spawn(self.speaker.writer())
        event(self.log, "telemetry ready", **msgspec.structs.asdict(self.detector.config))
        await stop.wait()
        await svc.stop()
        if self._probe is not None:
            self._probe.cancel()

    # -- inputs ------------------------------------------------------------------------

    def _intake(self) -> list[tuple[str, str]]:
        """(endpoint name, subject) of each subscription to this replica's partitions:
        one for all of them when it is the only replica."""
        c = self.config
        if c.shards == 1:
            return [("heartbeat", subjects.INTAKE_ALL)]
        return [
            ("heartbeat" if i == 0 else f"heartbeat-p{p}", subjects.intake(p))
            for i, p in enumerate(self.partitions)
        ]

    async def _on_unmapped(self, beat: Heartbeat) -> None:
        if self.config.shards > 1:
            partition = zlib.crc32(beat.node_id.encode()) % subjects.INTAKE_PARTITIONS
            if partition not in self.partitions:
                return
            if not self.unmapped:
                event(
                    self.log,
                    "heartbeats arrive unmapped: every replica reads every beat; give the "
                    "server the mappings of hecate.wire.subjects.MAPPINGS",
                    logging.WARNING,
                    node_id=beat.node_id,
                )
        self.unmapped += 1
        await self._on_heartbeat(beat)

    async def _on_heartbeat(self, beat: Heartbeat) -> None:
        node_id = beat.node_id
        last = self.last_seq.get(node_id)
        if last is not None and beat.seq > last + 1:
            self.beats_missed += beat.seq - last - 1
        self.last_seq[node_id] = beat.seq  # lower: the node restarted and counts afresh
        was = self.nodes.get(node_id)
        state = observe(
            was or NodeState(),
            Sample(
                latency_ms=beat.latency_ms,
                load=beat.load,
                score=beat.score,
                in_flight=beat.in_flight,
            ),
            now=time.monotonic(),
            alpha=self.alpha,
        )
        self.nodes[node_id] = state
        interval = max(beat.interval_ms, 1.0) / 1000
        self.detector.heartbeat(node_id, time.monotonic(), interval, loading=beat.loading)
        self.wall[node_id] = time.time()
        self.interval[node_id] = interval
        self.draining[node_id] = beat.draining
        self.memory[node_id] = beat.memory_used
        if was is None or not was.alive:
            await self._liveness(node_id, up=True, reason="heartbeat")
        self.speaker.touch(node_id)

    async def _on_leave(self, leave: NodeLeave) -> None:
        if leave.node_id in self.nodes and self.nodes[leave.node_id].alive:
            self.nodes[leave.node_id] = msgspec.structs.replace(
                self.nodes[leave.node_id], alive=False, in_flight=0
            )
            self.detector.forget(leave.node_id)
            await self._liveness(leave.node_id, up=False, reason=f"left: {leave.reason}")

    # -- liveness ----------------------------------------------------------------------

    async def _sweep(self) -> None:
        link = self.link
        assert link is not None, "swept before the link was proven"
        skipped = False
        back = 0.0
        while True:
            period = min(self.interval.values(), default=0.1) / 2
            due = time.monotonic() + period
            await asyncio.sleep(period)
            inbound = self.service.inbound
            if inbound is None or not inbound.is_connected:
                continue  # we hear nobody while we are cut off: that says nothing of them
            now = time.monotonic()
            if self.service.reconnected_at > back:  # silence before we were back is not theirs
                back = self.service.reconnected_at
                self.detector.deaf_until(back)
            late = now - due
            if late > period:  # our own loop stalled: we were not watching, they were not silent
                self.detector.blind(now, late)
                link.blind(now, late)  # nor could we read a PONG
                self.stalls += 1
                self.blind_s += late
                if not skipped:  # the heartbeats that queued meanwhile are read first
                    skipped = True
                    continue
            skipped = False
            # Silence is measured up to the last moment our own link is known to have
            # worked, not up to now: a link held silent makes nobody silent.
            proven = self._link_proven(link, inbound, now)
            self._deaf(link.sweep(now, period), link.silent_for(now))
            self.sweeps += 1
            for node_id, state in list(self.nodes.items()):
                if state.alive and self.detector.suspected(node_id, proven):
                    reason = self._silence(node_id, proven)
                    self.nodes[node_id] = msgspec.structs.replace(state, alive=False, in_flight=0)
                    # If it comes back it starts afresh: the silence that made it dead (a
                    # restart, say) is not a gap it is entitled to repeat.
                    self.detector.forget(node_id)
                    await self._liveness(node_id, up=False, reason=reason)

    def _link_proven(self, link: Link, inbound: Client, now: float) -> float:
        """When the link the heartbeats come in on last proved it works: the moment the
        latest PING answered went out (every heartbeat the server had by then came in
        before its PONG). Sends the next PING when none is out.

        A link held open and silent (its server cut off from the cluster, nothing
        closed) brings no heartbeat from anyone, and the client notices only when its
        own pings run out (15 s and more); judged up to now, every node would look dead.
        The PING waits in a task of its own, never cancelled: nats-py fails its reader
        on the PONG of a flush that timed out, and drops the PINGs of a connection it
        replaced (so a PING out before the last reconnect is given up)."""
        probe = self._probe
        if probe is not None and probe.done():
            if not probe.cancelled() and probe.exception() is None:
                link.answered(self._probe_sent)
            probe = None
        elif probe is not None and self.service.reconnected_at > self._probe_sent:
            probe = None  # its PING went with the old connection
        if probe is None:
            self._probe_sent = now
            self._probe = asyncio.ensure_future(inbound.flush(timeout=PING_TIMEOUT_S))
            self._probe.add_done_callback(_quietly)
        return link.proven_at

    def _deaf(self, news: LinkNews | None, for_s: float) -> None:
        """Log a spell of sweeps whose link was not proven lately, as it starts and ends."""
        if news == "silent":
            event(self.log, "link silent: judging nobody", logging.WARNING, for_s=for_s)
        elif news == "answers again":
            event(self.log, "link answers again", logging.WARNING)

    def _silence(self, node_id: str, now: float) -> str:
        """Why a node is down, in the detector's figures."""
        d = self.detector
        if d.loading(node_id):
            return (
                f"silent for {d.silence(node_id, now) * 1000:.0f} ms while loading "
                f"(a load is allowed {d.config.loading_silence_s * 1000:.0f} ms)"
            )
        mean, std = d.expected(node_id)
        phi, patience = d.phi(node_id, now), d.patience(node_id)
        return (
            f"silent for {d.silence(node_id, now) * 1000:.0f} ms "
            f"(phi {phi:.1f} >= {d.config.threshold:g}; gaps expected "
            f"{mean * 1000:.0f} +- {std * 1000:.0f} ms; patience {patience * 1000:.0f} ms)"
        )

    def figures(self) -> dict[str, object]:
        """The detector's view, for ``$SRV.STATS``: what each live node's history buys it."""
        return {
            "patience_ms": {
                i: round(self.detector.patience(i) * 1000, 1)
                for i in sorted(self.detector.nodes)
                if self.nodes.get(i, NodeState()).alive
            },
            "loading": [i for i in sorted(self.detector.nodes) if self.detector.loading(i)],
            "sweeps": self.sweeps,
            "stalls": self.stalls,
            "blind_s": round(self.blind_s, 3),
            "deaf_sweeps": self.link.deaf_sweeps if self.link is not None else 0,
            "identity_mismatch": self.identity.refused,
            "shard": self.config.shard,
            "shards": self.config.shards,
            "partitions": list(self.partitions),
            "unmapped": self.unmapped,
            "beats_missed": self.beats_missed,
            **self.speaker.figures(),
        }

    async def _liveness(self, node_id: str, *, up: bool, reason: str) -> None:
        state: Literal["up", "down"] = "up" if up else "down"
        news = NodeEvent(node_id=node_id, state=state, reason=reason, at=time.time())
        await self.speaker.liveness(news)

    # -- output ------------------------------------------------------------------------

    def entry(self, node_id: str) -> NodeTelemetry:
        """What followers are told of ``node_id`` now."""
        n = self.nodes[node_id]
        return NodeTelemetry(
            alive=n.alive,
            latency_ms=n.latency_ms,
            load=n.load,
            score=n.score,
            in_flight=n.in_flight,
            last_seen=self.wall.get(node_id),
            draining=self.draining.get(node_id, False),
            memory_used=self.memory.get(node_id, 0),
        )
