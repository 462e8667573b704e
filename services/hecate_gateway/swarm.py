"""What the gateway knows of the swarm: the plan, telemetry, breakers and the event feed,
followed live over NATS, for ``/v1/models``, readiness, the swarm gauges and the page.

Listens: KV ``hecate-plan/current`` (the revision is the epoch), ``hecate-telemetry/
snapshot``, every key of ``hecate-breakers``, and ``hecate.events.>`` (failover, plan,
node down/up, breaker). Holds: the latest of each, the last events (:class:`Feed`), their
tallies and a tokens/s window. Decides nothing itself: :func:`hecate_gateway.swarmreport.report`
works out what the page, ``/v1/models`` and the gauges show. Publishes nothing.

The state as JSON (``GET /v1/swarm``, and the ``state`` events of ``/v1/swarm/events``)::

    {
      "at": 1767000000.1,            # wall clock of this gateway
      "has_plan": true, "epoch": 3,  # the plan's KV revision
      "nodes_up": 3, "nodes_down": 1, "nodes_draining": 0,
      "tokens_per_s": 41.2,          # generated tokens this gateway answered, last 5 s
      "servable_models": ["ncm-base"],
      "nodes": [{"node_id": "gpu", "health": "up" | "down" | "draining",
                 "circuit": "closed" | "open" | "half_open",
                 "serving": true,    # up and circuit closed: a router would send to it
                 "in_plan": true, "latency_ms": 3.6, "load": 0.2, "in_flight": 1,
                 "last_seen": 1767000000.0}, ...],
      "models": [{"model_id": "ncm-base", "role": "base" | "expert" | "reserve",
                  "layers": 12, "replicas_wanted": 2,
                  "pipelines": [{"pipeline_id": "ncm-base-r0",
                                 "complete": true,   # telemetry hears every node
                                 "servable": true,   # a router would send to it
                                 "stages": [{"node_id": "gpu", "layer_start": 0,
                                             "layer_end": 12}]}, ...],
                  "complete_pipelines": 2, "servable_pipelines": 2,
                  "live_replicas": [2, 2, ...],  # per layer: distinct up nodes hosting it
                  "min_live_replicas": 2,
                  "servable": true, "via_reserve": null}, ...],
      "counters": {"failovers": {"replica": 4}, "breaker_trips": 0},
      "plan_heard": 1767000000.0,    # the planner's last notice, repeats included
                                     # (null: none heard yet)
      "feed_rev": 17,
      "feed": [{"id": 9, "rev": 17, "at": 1767000000.0,
                "kind": "failover" | "plan" | "node" | "breaker",
                "tag": "replica",     # failover kind, node/circuit state, plan strategy
                "text": "ncm-base lost gpu: ncm-base-r0 -> ncm-base-r1 (no responders)",
                "node_id": "gpu", "model_id": "ncm-base",
                "count": 3}, ...]     # newest first; like events within 5 s fold
    }

A ``feed`` line keeps its ``id`` when a like event folds into it (``count`` grows) and
gets a new ``rev``; the planner's repeat of its last notice adds no line, it only moves
``plan_heard``. ``/v1/swarm/events`` sends ``state`` without ``feed`` after the first,
and each new or changed line as a ``feed`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client.registry import CollectorRegistry

from hecate.bus import kv as kvs
from hecate.bus import telemetry
from hecate.bus.logs import event
from hecate.core import SwarmPlan
from hecate.core.kinds import ExecutorKind
from hecate.resilience.breaker import BreakerSnapshot
from hecate.wire import subjects
from hecate.wire.messages import (
    TelemetrySnapshot,
)
from hecate_gateway.swarmevents import EVENT_SUBJECTS, EVENTS
from hecate_gateway.swarmfeed import Feed, FeedEntry, Tally, TokenRate
from hecate_gateway.swarmgauges import SwarmCollector
from hecate_gateway.swarmreport import Circuit, NodeSeen, SwarmReport, report

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(dict[str, Any]).decode
_plan = msgspec.json.Decoder(SwarmPlan)
_breaker = msgspec.json.Decoder(BreakerSnapshot)


class SwarmWatch:
    """Follows the swarm's state. The interface the rest of the gateway uses:
    :meth:`run`, :attr:`has_plan`, :meth:`servable_models`, :meth:`count_tokens`,
    :meth:`snapshot`, :meth:`register_metrics`; the page also waits on :meth:`changed`.

    ``clock`` is the wall clock of events and ``tick`` the monotonic one of the
    tokens/s window (``count_tokens`` is given ``time.monotonic()``)."""

    def __init__(
        self,
        *,
        feed_size: int = 200,
        fold_s: float = 5.0,
        tokens_window_s: float = 5.0,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
        tick: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log or logging.getLogger("hecate_gateway.swarm")
        self.clock, self.tick = clock, tick
        self.plan: SwarmPlan | None = None
        self.epoch = 0
        self.telemetry: TelemetrySnapshot | None = None
        self.circuits: dict[str, Circuit] = {}
        self.feed = Feed(size=feed_size, fold_s=fold_s)
        self.tally = Tally()
        self.tokens = TokenRate(window_s=tokens_window_s)
        self.version = 0  # grows on every change the page would show
        self._wake = asyncio.Event()
        self._report: tuple[int, SwarmReport] | None = None
        self._doc: tuple[int, dict[str, Any]] | None = None

    # -- the interface -----------------------------------------------------------------

    async def run(self, nc: Client) -> None:
        """Follow plan, telemetry, breakers and events until cancelled. A bucket not
        created yet is waited for (its owner may start after the gateway)."""
        # One subscription per event subject rather than hecate.events.>: a locked-down
        # bus grants an observer exactly the events of the contract.
        subs = [await nc.subscribe(subject, cb=self._on_event) for subject in EVENT_SUBJECTS]
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._follow_plan(nc))
                tg.create_task(self._follow_telemetry(nc))
                tg.create_task(self._follow_breakers(nc))
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    @property
    def has_plan(self) -> bool:
        return self.plan is not None

    def servable_models(self) -> list[str]:
        """Models the current plan can serve: at least one pipeline a router would send
        to, or, for a model whose pipelines all fail, a reserve model that has one."""
        return self.report().servable_models()

    def executor_kind(self, model_id: str) -> ExecutorKind | None:
        """How the current plan's nodes compute ``model_id`` (None: not known yet)."""
        return self.plan.executor_kind(model_id) if self.plan is not None else None

    def count_tokens(self, n: int, now: float) -> None:
        """The gateway streamed or answered ``n`` generated tokens at ``now``
        (``time.monotonic()``), for the live tokens/s."""
        self.tokens.add(n, now)

    def snapshot(self, *, feed: bool = True) -> dict[str, Any]:
        """The whole state as JSON-able data (``GET /v1/swarm``; the shape is in the
        module docstring). ``feed=False`` leaves the feed lines out."""
        r = self.report()
        doc: dict[str, Any] = {"at": self.clock(), **self._report_doc()}
        doc["tokens_per_s"] = round(self.tokens.rate(self.tick()), 2)
        doc["servable_models"] = r.servable_models()
        doc["counters"] = {
            "failovers": dict(self.tally.failovers),
            "breaker_trips": self.tally.breaker_trips,
        }
        doc["plan_heard"] = self.tally.plan_heard
        doc["feed_rev"] = self.feed.rev
        if feed:
            doc["feed"] = [msgspec.to_builtins(e) for e in self.feed.newest_first()]
        return doc

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Expose the swarm gauges and event counters on ``registry`` (the gateway's
        ``/metrics``), read from this watch at each scrape."""
        registry.register(SwarmCollector(self))

    # -- for the page ------------------------------------------------------------------

    def report(self) -> SwarmReport:
        """The plan over telemetry and circuits, worked out once per change."""
        if self._report is None or self._report[0] != self.version:
            seen = {
                node_id: NodeSeen(
                    alive=t.alive,
                    draining=t.draining,
                    latency_ms=t.latency_ms,
                    load=t.load,
                    in_flight=t.in_flight,
                    last_seen=t.last_seen,
                    memory_used=t.memory_used,
                )
                for node_id, t in (self.telemetry.nodes if self.telemetry else {}).items()
            }
            self._report = (self.version, report(self.plan, self.epoch, seen, self.circuits))
        return self._report[1]

    def _report_doc(self) -> dict[str, Any]:
        """The report as JSON data (lists, not tuples: what ``GET /v1/swarm`` reads back
        as), once per change however many pages ask."""
        if self._doc is None or self._doc[0] != self.version:
            doc: dict[str, Any] = _decode(_encode(self.report()))
            self._doc = (self.version, doc)
        return dict(self._doc[1])

    def feed_since(self, rev: int) -> list[FeedEntry]:
        return self.feed.since(rev)

    async def changed(self, seen: int) -> int:
        """The version once it is past ``seen`` (at once if it already is)."""
        while self.version == seen:
            await self._wake.wait()
        return self.version

    def _changed(self) -> None:
        self.version += 1
        # Every waiter holds this event; the next change needs a fresh one.
        self._wake.set()
        self._wake = asyncio.Event()

    # -- what the bus said (the loops below feed these; tests call them directly) -------

    def adopt_plan(self, plan: SwarmPlan | None, revision: int) -> None:
        """The plan at ``revision`` (the epoch); None: the key was deleted."""
        self.plan = plan
        self.epoch = revision if plan is not None else 0
        self._changed()

    def adopt_telemetry(self, snapshot: TelemetrySnapshot | None) -> None:
        self.telemetry = snapshot
        self._changed()

    def adopt_circuit(self, target: str, value: bytes | None) -> bool:
        """One key of the breaker bucket (None: deleted, the circuit is closed)."""
        try:
            state = _breaker.decode(value).state if value else "closed"
        except msgspec.DecodeError:
            return False
        if state == "closed":
            self.circuits.pop(target, None)
        else:
            self.circuits[target] = state
        self._changed()
        return True

    # -- following the bus ---------------------------------------------------------------

    async def _follow_plan(self, nc: Client) -> None:
        kv = await kvs.wait_bucket(nc, subjects.PLAN_BUCKET)
        async for plan, revision in kvs.follow(
            kv, subjects.PLAN_KEY, _plan, kvs.ignored(self.log, "plan")
        ):
            self.adopt_plan(plan, revision)

    async def _follow_telemetry(self, nc: Client) -> None:
        kv = await kvs.wait_bucket(nc, subjects.TELEMETRY_BUCKET)
        bad = kvs.ignored(self.log, "telemetry")
        async for snapshot, _part in telemetry.follow(nc, kv, bad, log=self.log):
            self.adopt_telemetry(snapshot)

    async def _follow_breakers(self, nc: Client) -> None:
        kv = await kvs.wait_bucket(nc, subjects.BREAKER_BUCKET)
        watcher = await kv.watchall()
        try:
            kvs.still_cancelled()  # its setup waits with asyncio.wait_for
            async for entry in watcher:
                if entry is not None and entry.key is not None:
                    self.adopt_circuit(entry.key, entry.value or None)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    async def _on_event(self, msg: Msg) -> None:
        self.take(msg.subject, msg.data)

    def take(self, subject: str, data: bytes) -> bool:
        """One event from ``hecate.events.>``: into the feed and the tallies. False for
        a subject this gateway does not know (a newer service's event) or a body that
        does not decode."""
        take = EVENTS.get(subject)
        if take is None:
            return False
        try:
            take(self.feed, self.tally, data)
        except msgspec.DecodeError as exc:
            event(self.log, "bad event ignored", logging.WARNING, subject=subject, error=str(exc))
            return False
        self._changed()
        return True
